// Command native is sluice's filter as an Envoy dynamic module,
// libsluice.so, built with cgo:
//
//	go build -buildmode=c-shared -o libsluice.so ./filter/native     (or: make native)
//
// Envoy (1.40 or later) loads it with the envoy.filters.http.dynamic_modules
// filter, dynamic_module_config {name: sluice, do_not_close: true},
// filter_name "sluice", and filter_config the same plugin configuration JSON
// filter.wasm takes. A Go runtime cannot be unloaded (do_not_close), and
// only one may be loaded in an Envoy process: see docs/envoy.md.
//
// This build is the host without the pipeline: it checks the plugin
// configuration as filter.wasm does (a bad one is rejected whole, with its
// field) and lets every request through. The request pipeline joins it on
// the host-independent core.
package main

import (
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

func main() {}

func init() {
	dynmod.Register(newFilter)
}

// filterName is the filter_name the module answers to.
const filterName = "sluice"

// filter is one filter configuration.
type filter struct{ conf *config.Config }

// newFilter checks the plugin configuration.
func newFilter(c *dynmod.Config, name string, raw []byte) (dynmod.ConfigHandler, error) {
	if name != filterName {
		return nil, unknownFilterError(name)
	}
	conf, err := config.Parse(raw)
	if err != nil {
		return nil, err
	}
	// A warning: this build does not limit anything yet.
	dynmod.Logf(dynmod.LogWarn, "sluice: configuration of domain %q accepted; this build lets every request through (no pipeline yet)", conf.Domain)
	return &filter{conf: conf}, nil
}

// unknownFilterError is the error of a filter_name the module lacks.
type unknownFilterError string

func (e unknownFilterError) Error() string {
	return "sluice: no filter named " + string(e) + " (filter_name must be \"" + filterName + "\")"
}

// NewStream lets the stream through.
func (f *filter) NewStream(*dynmod.Stream) dynmod.StreamHandler { return nil }

// Destroy releases nothing.
func (f *filter) Destroy() {}
