// Package dynmod binds Go to Envoy's dynamic module C ABI (Envoy 1.40, ABI
// v0.2.0) for HTTP filters: the event hooks Envoy calls are exported with
// cgo and forwarded to the handlers a module registers; the callbacks Envoy
// offers are methods of Config, Stream, Scheduler and Response.
//
// A module is a main package built with -buildmode=c-shared that calls
// Register from an init function. Envoy then calls, on its main thread,
// the registered Factory once per filter configuration with the filter's
// filter_config, and, on a worker thread, the ConfigHandler's NewStream for
// every HTTP stream, then the StreamHandler's hooks for that stream.
//
// Threads. Every worker thread calls into the same Go runtime, so state
// shared by streams is plain Go memory (guard it). A Stream's methods may be
// called only on its worker thread, during one of its hooks or from a
// function that Scheduler.Post runs; Scheduler.Post and Config.Post may be
// called from any goroutine; a Config's callouts only on the main thread
// (from a function Config.Post runs).
//
// Memory. What Envoy hands over (header values, bodies, a callout's answer)
// is valid only until the hook returns: the methods copy it into Go memory,
// or append it to a buffer the caller owns. Envoy never holds a Go pointer:
// it holds cgo handles for configurations and streams, and C memory for the
// headers we send.
//
// Failures. A panic in a handler is recovered at the hook: the stream goes on
// without its handler (a paused request or response is resumed) and the
// function set with SetPanicHandler is told. A Go runtime error that cannot
// be recovered (a fatal error such as concurrent map writes) ends Envoy.
//
// RATIONALE.md records the facts of the ABI this binding relies on, and how
// each was checked.
package dynmod
