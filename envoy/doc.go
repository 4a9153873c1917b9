// Package envoy holds envoy.yaml and envoy-native.yaml, the Envoy bootstraps users copy to run
// sluice, and Local, which points them at this machine's filter, control plane and backend.
//
// envoy.yaml is a complete Envoy v3 bootstrap: a listener on 0.0.0.0:10000 whose
// http_connection_manager runs the sluice Wasm filter (filter.wasm, loaded by the V8 runtime from a
// local file) in front of the router; the filter calls the control plane through the cluster
// sluice_controlplane (HTTP/2, 127.0.0.1:8081), and the router sends allowed requests on to the
// cluster backend. It needs Envoy 1.36 or later; 1.36.2, 1.37.0, 1.39.3 and 1.40.0 are tested
// (ENVOY_BIN selects the binary; see the README). envoy-native.yaml is the same with the native
// filter, libsluice.so, an Envoy dynamic module that Envoy 1.40 or later finds by name in
// $ENVOY_DYNAMIC_MODULES_SEARCH_PATH: the same plugin configuration, the same stats.
//
// The tests run real Envoy on each file itself, with only the filter's path (or search path) and
// the addresses changed: `envoy --mode validate` accepts it (validate mode also loads the filter
// and has it check the plugin configuration, with the filter's own parser), refuses copies with a
// bad field and names the field; and Envoy serves traffic through it in front of a real control
// plane. `make run` (e2e/cmd/sluice-dev) runs envoy.yaml, `make run FILTER=native`
// envoy-native.yaml.
package envoy
