// Package host is an Envoy-like proxy-wasm host on wazero, for running
// sluice's filter.wasm end to end where no Envoy binary is available.
//
// New loads a module once and starts one VM (module instance) per worker,
// with the proxy-wasm ABI 0.2.1 host functions in module "env", WASI with the
// real clocks, and the start-up lifecycle Envoy runs (_initialize,
// proxy_on_context_create for the root context, proxy_on_vm_start,
// proxy_on_configure). Shared data (with CAS), shared queues and metrics are
// shared by all VMs of a Host; ticks and HTTP call responses are delivered on
// the VM that asked for them, serialized with everything else on that VM.
//
// Proxy is an http.Handler that filters each request on a worker VM and
// forwards it with httputil.ReverseProxy; VM.NewStream and the Stream
// methods drive the same callbacks directly, without sockets.
//
// RATIONALE.md in this directory lists where Envoy's behaviour was followed
// and how it was decided.
package host
