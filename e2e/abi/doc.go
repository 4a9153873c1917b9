// Package abi tests how the filter uses its host's ABI inside real Envoy:
// filter.wasm's proxy-wasm ABI under V8 (one VM per worker and what that
// does to the precheck, ticks, the counters in Envoy's /stats,
// proxy_http_call and proxy_grpc_call to the control-plane cluster, paused
// streams resumed, local replies and their headers, a configuration
// refused in proxy_on_configure, and a trapped VM reloaded), and the same
// for the native module where it applies: the scenarios that are about a
// request's path (TestHeaders, TestTransports, TestPerWorkerPrecheck) and
// the per-Envoy state's bound under 100,000 keys (TestSharedStateChurn) run
// on each host of stack.FilterHosts. What stays proxy-wasm's alone is the
// Wasm VM's own life, which a dynamic module does not have: a VM that
// traps and is reloaded (TestTrappedVM, and what survives the reload:
// TestSharedBlocksSurviveReload, TestLeaseSurvivesReload), the module's
// WASI imports, and proxy_on_configure's refusal (the native module's
// refusals run in e2e's TestBadPluginConfig, its panics and reloads in
// filter/native's tests). RATIONALE.md records what differs from the
// wazero host that e2e/host was.
//
// testdata/guest is a small proxy-wasm module of its own (not sluice's
// filter) whose behaviour the request path chooses: it can trap on demand,
// which sluice's filter never does.
package abi
