package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"bytes"
	"errors"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// ConfigHandler is a module's filter configuration.
type ConfigHandler interface {
	// NewStream returns the handler of a new HTTP stream, on the stream's
	// worker thread; nil lets the stream pass untouched.
	NewStream(s *Stream) StreamHandler
	// Destroy releases the configuration, on the main thread, once Envoy
	// dropped it and no stream uses it.
	Destroy()
}

// Config is Envoy's side of one filter configuration
// (DynamicModuleHttpFilterConfig).
type Config struct {
	envoy    unsafe.Pointer // Envoy's configuration, valid until config_destroy
	handler  ConfigHandler
	main     Scheduler                  // runs functions on the main thread
	defining bool                       // the Factory is running: metrics may be defined
	calls    map[uint64]func(*Response) // callouts in flight (main thread)
	arena    cArena                     // the callouts' headers (main thread)
}

// Post queues fn to run on Envoy's main thread and reports whether it was
// queued (false once the configuration is dropped). Any goroutine may call
// it; fn may call Callout.
func (c *Config) Post(fn func()) bool { return c.main.Post(fn) }

// ErrMetricsFrozen is returned for a metric defined outside the Factory:
// Envoy freezes a configuration's metrics once it is made.
var ErrMetricsFrozen = errors.New("dynmod: metrics are defined only while the Factory runs")

// Counter is a counter of Envoy's stats, named <metrics_namespace>.<name>.
// Any goroutine may add to it.
type Counter struct {
	config unsafe.Pointer
	id     C.size_t
}

// Gauge is a gauge of Envoy's stats. Any goroutine may change it.
type Gauge struct {
	config unsafe.Pointer
	id     C.size_t
}

// DefineCounter defines a counter; call it while the Factory runs.
func (c *Config) DefineCounter(name string) (Counter, error) {
	if !c.defining {
		return Counter{}, ErrMetricsFrozen
	}
	var id C.size_t
	if r := C.dm_http_filter_config_define_counter(c.envoy, strBuf(name), nil, 0, &id); r != 0 {
		return Counter{}, metricsErr(r)
	}
	return Counter{c.envoy, id}, nil
}

// DefineGauge defines a gauge; call it while the Factory runs.
func (c *Config) DefineGauge(name string) (Gauge, error) {
	if !c.defining {
		return Gauge{}, ErrMetricsFrozen
	}
	var id C.size_t
	if r := C.dm_http_filter_config_define_gauge(c.envoy, strBuf(name), nil, 0, &id); r != 0 {
		return Gauge{}, metricsErr(r)
	}
	return Gauge{c.envoy, id}, nil
}

// metricsErr describes a metrics result other than success.
func metricsErr(r C.dm_enum) error {
	switch r {
	case 1:
		return errors.New("dynmod: metric not found")
	case 2:
		return errors.New("dynmod: invalid metric labels")
	case 3:
		return ErrMetricsFrozen
	}
	return errors.New("dynmod: metrics error")
}

// Add adds n to the counter. The zero Counter does nothing.
func (m Counter) Add(n uint64) {
	if m.config != nil {
		C.dm_http_filter_config_increment_counter(m.config, m.id, nil, 0, C.uint64_t(n))
	}
}

// Set sets the gauge.
func (m Gauge) Set(v uint64) {
	if m.config != nil {
		C.dm_http_filter_config_set_gauge(m.config, m.id, nil, 0, C.uint64_t(v))
	}
}

// Add raises the gauge by n.
func (m Gauge) Add(n uint64) {
	if m.config != nil {
		C.dm_http_filter_config_increment_gauge(m.config, m.id, nil, 0, C.uint64_t(n))
	}
}

// Sub lowers the gauge by n.
func (m Gauge) Sub(n uint64) {
	if m.config != nil {
		C.dm_http_filter_config_decrement_gauge(m.config, m.id, nil, 0, C.uint64_t(n))
	}
}

// configOf returns the Config of a handle Envoy gives back; it panics if
// the handle is not one (callers recover).
func configOf(h C.uintptr_t) *Config { return cgo.Handle(h).Value().(*Config) }

//export envoy_dynamic_module_on_http_filter_config_new
func envoy_dynamic_module_on_http_filter_config_new(envoy unsafe.Pointer, name, config C.dm_buf) (handle C.uintptr_t) {
	c := &Config{envoy: envoy, calls: map[uint64]func(*Response){}}
	defer func() {
		if v := recover(); v != nil {
			// A configuration whose making panicked is rejected, as if the
			// Factory had returned an error.
			c.main.close()
			handle = 0
			reportPanic("http_filter_config_new", v)
		}
	}()
	f := factory.Load()
	if f == nil {
		Log(LogCritical, "sluice: the module registered no filter factory")
		return 0
	}
	sizeRuntime(max(1, Concurrency()))
	c.main.open(C.dm_http_filter_config_scheduler_new(envoy), true)
	c.defining = true
	h, err := (*f)(c, strings.Clone(view(name)), bytes.Clone([]byte(view(config))))
	c.defining = false
	if err != nil {
		Logf(LogError, "sluice: filter configuration %q rejected: %v", view(name), err)
		c.main.close()
		return 0
	}
	c.handler = h
	return C.uintptr_t(cgo.NewHandle(c))
}

//export envoy_dynamic_module_on_http_filter_config_destroy
func envoy_dynamic_module_on_http_filter_config_destroy(handle C.uintptr_t) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("http_filter_config_destroy", v)
		}
	}()
	c := configOf(handle)
	cgo.Handle(handle).Delete()
	c.main.close()
	c.arena.free()
	c.calls = nil
	c.handler.Destroy()
}

//export envoy_dynamic_module_on_http_filter_config_scheduled
func envoy_dynamic_module_on_http_filter_config_scheduled(envoy unsafe.Pointer, handle C.uintptr_t, event C.uint64_t) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("http_filter_config_scheduled", v)
		}
	}()
	if fn := configOf(handle).main.take(uint64(event)); fn != nil {
		fn()
	}
}

//export envoy_dynamic_module_on_http_filter_config_http_callout_done
func envoy_dynamic_module_on_http_filter_config_http_callout_done(envoy unsafe.Pointer, handle C.uintptr_t, id C.uint64_t,
	result C.dm_enum, headers *C.dm_header, nh C.size_t, body *C.dm_buf, nb C.size_t) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("http_filter_config_http_callout_done", v)
		}
	}()
	c := configOf(handle)
	done := c.calls[uint64(id)]
	delete(c.calls, uint64(id))
	if done != nil {
		r := newResponse(result, headers, nh, body, nb)
		done(&r)
	}
}
