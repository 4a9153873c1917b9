package stack

import (
	"context"
	"path/filepath"
	"testing"
)

// FilterHost is one way real Envoy runs sluice's filter: the artifact it
// loads and the HTTP filter that loads it. FilterHosts is the table of
// them; every e2e scenario that runs the filter in real Envoy runs once per
// row (a test per host, named after it), from one description of the
// scenario.
type FilterHost struct {
	// Name names the host in test names.
	Name string
	// File is the artifact's file name.
	File string
	// Build builds the artifact into the file out.
	Build func(ctx context.Context, out string) error
	// filter returns the HTTP filter running the artifact at path as the
	// plugin instance name with the plugin configuration plugin (JSON).
	filter func(path, name string, plugin []byte) M
	// StatPrefix is what Envoy shows before the filter's metric names.
	StatPrefix string
}

// ProxyWasm is filter.wasm (filter/proxywasm) under V8.
var ProxyWasm = FilterHost{Name: "proxywasm", File: "filter.wasm", Build: BuildWasm, filter: namedWasmFilter,
	StatPrefix: "wasmcustom."}

// Native is libsluice.so (filter/native), the Envoy dynamic module, loaded
// from its file with do_not_close and filter.wasm's stat names.
var Native = FilterHost{Name: "native", File: "libsluice.so", Build: BuildNative, filter: namedNativeFilter,
	StatPrefix: "wasmcustom."}

// FilterHosts is the table of the filter's hosts the e2e scenarios run on.
var FilterHosts = []FilterHost{ProxyWasm, Native}

// Filter is a host's artifact, built.
type Filter struct {
	Host FilterHost
	Path string
}

// HTTPFilter returns the Envoy HTTP filter running f as the plugin instance
// name with the plugin configuration plugin (JSON).
func (f Filter) HTTPFilter(name string, plugin []byte) M { return f.Host.filter(f.Path, name, plugin) }

// HTTPFilterReadingBodies is HTTPFilter for a plugin configuration that
// reads request bodies (reserve_from_request): a request's headers wait
// while its body reaches the filter, which Envoy's proxy-wasm host allows
// only with allow_on_headers_stop_iteration.
func (f Filter) HTTPFilterReadingBodies(name string, plugin []byte) M {
	m := f.Host.filter(f.Path, name, plugin)
	if f.Host.Name == ProxyWasm.Name {
		m["typed_config"].(M)["config"].(M)["allow_on_headers_stop_iteration"] = true
	}
	return m
}

// Stat returns the name Envoy's /stats shows the filter's metric under
// ("sluice.allowed" as "wasmcustom.sluice.allowed").
func (f Filter) Stat(metric string) string { return f.Host.StatPrefix + metric }

// BuildFilters builds the artifact of every host of FilterHosts into dir.
func BuildFilters(ctx context.Context, dir string) ([]Filter, error) {
	fs := make([]Filter, len(FilterHosts))
	for i, h := range FilterHosts {
		fs[i] = Filter{Host: h, Path: filepath.Join(dir, h.File)}
		if err := h.Build(ctx, fs[i].Path); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// namedWasmFilter is WasmFilter with the plugin's name.
func namedWasmFilter(path, name string, plugin []byte) M {
	f := WasmFilter(path, plugin)
	f["typed_config"].(M)["config"].(M)["name"] = name
	return f
}

// namedNativeFilter is NativeFilterFile under filter.wasm's stat names.
// The plugin instance name a Wasm filter takes has no use here: each
// filter of a listener is a configuration of its own.
func namedNativeFilter(path, _ string, plugin []byte) M {
	return NativeFilterFile(path, "sluice", plugin, "wasmcustom")
}

// ForEachFilter runs test once per built filter, each as a subtest named
// after its host: a scenario is written once and runs on every host.
func ForEachFilter(t *testing.T, filters []Filter, test func(t *testing.T, f Filter)) {
	t.Helper()
	if len(filters) == 0 {
		t.Skip("no filter was built (short mode)")
	}
	for _, f := range filters {
		t.Run(f.Host.Name, func(t *testing.T) { test(t, f) })
	}
}
