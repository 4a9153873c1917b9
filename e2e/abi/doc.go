// Package abi tests how filter.wasm uses the proxy-wasm ABI inside real
// Envoy (V8): one VM per worker and what that does to the precheck, ticks,
// the counters in Envoy's /stats, proxy_http_call to the control-plane
// cluster, paused streams resumed, local replies and their headers, a
// configuration refused in proxy_on_configure, and a trapped VM reloaded.
// RATIONALE.md records what differs from the wazero host that e2e/host was.
//
// testdata/guest is a small proxy-wasm module of its own (not sluice's
// filter) whose behaviour the request path chooses: it can trap on demand,
// which sluice's filter never does.
package abi
