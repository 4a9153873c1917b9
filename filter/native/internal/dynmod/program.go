package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
)

// Factory makes the handler of one filter configuration from the filter's
// name (DynamicModuleFilter.filter_name) and configuration (filter_config,
// the bytes of its StringValue or BytesValue). It runs on Envoy's main
// thread; an error rejects the configuration with the error in Envoy's log.
// Metrics can be defined only while it runs.
type Factory func(c *Config, name string, config []byte) (ConfigHandler, error)

// factory is the module's Factory, set by Register before Envoy loads any
// configuration.
var factory atomic.Pointer[Factory]

// Register sets the module's Factory. Call it from the main package's init:
// Envoy asks for configurations right after loading the module.
func Register(f Factory) { factory.Store(&f) }

// loaded is set once every callback the binding calls was found in the
// process: the binding calls none before (a test binary never sets it).
var loaded atomic.Bool

// abiVersion is the C string on_program_init returns; Envoy reads it during
// the call only, but it is allocated once and kept for the process.
var abiVersion = C.CString(ABIVersion)

//export envoy_dynamic_module_on_program_init
func envoy_dynamic_module_on_program_init() (version *C.char) {
	defer func() {
		if v := recover(); v != nil {
			reportPanic("program_init", v)
			version = nil
		}
	}()
	if missing := resolve(); missing != nil {
		// Envoy unloads the module and reports the load as failed; the names
		// tell which Envoy feature this build of Envoy lacks.
		msg := fmt.Sprintf("sluice: this Envoy lacks %d dynamic module callbacks the module needs: %s",
			len(missing), strings.Join(missing, ", "))
		println(msg) // Envoy's logger is one of the missing callbacks, perhaps
		return nil
	}
	loaded.Store(true)
	return abiVersion
}

// resolve looks Envoy's callbacks up and returns the names of those
// missing.
func resolve() []string {
	n := int(C.dm_resolve())
	var missing []string
	for i := 0; i < n; i++ {
		missing = append(missing, C.GoString(C.dm_missing(C.int(i))))
	}
	return missing
}

// Log writes msg to Envoy's log under the dynamic_modules logger, if level
// is enabled there. Any goroutine may call it.
func Log(level LogLevel, msg string) {
	if !loaded.Load() {
		return
	}
	C.dm_log(C.dm_enum(level), strBuf(msg))
}

// Logf formats and logs, formatting only when level is enabled.
func Logf(level LogLevel, format string, args ...any) {
	if !LogEnabled(level) {
		return
	}
	Log(level, fmt.Sprintf(format, args...))
}

// LogEnabled reports whether Envoy logs messages at level.
func LogEnabled(level LogLevel) bool {
	return loaded.Load() && bool(C.dm_log_enabled(C.dm_enum(level)))
}

// Level returns the level of Envoy's dynamic_modules logger (LogOff
// outside Envoy): what a module logs below it is dropped.
func Level() LogLevel {
	if !loaded.Load() {
		return LogOff
	}
	return LogLevel(C.dm_get_log_level())
}

// Concurrency returns Envoy's number of worker threads. Call it on the main
// thread (in a Factory or a function Config.Post runs).
func Concurrency() int {
	if !loaded.Load() {
		return 0
	}
	return int(C.dm_get_concurrency())
}

// Panic describes a panic recovered at a hook.
type Panic struct {
	Hook  string // the hook, e.g. "request_headers"
	Value any    // what was passed to panic
	Stack []byte // the goroutine's stack at the recovery
}

// panicHandler is told of every recovered panic.
var panicHandler atomic.Pointer[func(Panic)]

// SetPanicHandler sets the function told of every panic recovered at a
// hook (after the binding applied its outcome). It runs on the hook's
// thread and must not panic; without one, the panic is logged at error.
func SetPanicHandler(f func(Panic)) { panicHandler.Store(&f) }

// reportPanic tells the panic handler, or the log, of a recovered panic.
func reportPanic(hook string, v any) {
	p := Panic{Hook: hook, Value: v, Stack: debug.Stack()}
	defer func() {
		if recover() != nil {
			Log(LogError, "sluice: the panic handler panicked")
		}
	}()
	if f := panicHandler.Load(); f != nil {
		(*f)(p)
		return
	}
	Logf(LogError, "sluice: panic in %s: %v\n%s", hook, v, p.Stack)
}
