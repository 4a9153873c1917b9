// Package stack starts the pieces of a running sluice deployment on loopback:
// control-plane processes (the real sluice-controlplane binary, stopped by
// PID), real Envoy processes running filter.wasm (StartEnvoy, with
// bootstraps built from the pieces in envoyconfig.go) and an upstream that
// counts what reaches it.
//
// `make run` (e2e/cmd/sluice-dev), the end-to-end tests (package e2e) and the
// ABI tests (e2e/abi) are built from it.
package stack
