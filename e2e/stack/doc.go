// Package stack starts the pieces of a running sluice deployment on loopback:
// control-plane processes (the real sluice-controlplane binary, stopped by
// PID), gateways (filter.wasm in the e2e/host proxy-wasm host, the part Envoy
// plays in production) and an upstream that counts what reaches it.
//
// `make run` (e2e/cmd/sluice-dev), the end-to-end tests (package e2e) and the
// end-to-end benchmark (e2e/cmd/sluice-bench) are built from it.
package stack
