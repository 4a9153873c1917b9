// Package envoy holds sluice's Envoy configuration and the code that checks it against Envoy's API.
//
// envoy.yaml is a complete Envoy v3 bootstrap. It has a listener on 0.0.0.0:10000 whose
// http_connection_manager runs the sluice Wasm filter (filter.wasm, loaded by the V8 runtime from a
// local file) in front of the router. The filter calls the control plane through the cluster
// sluice_controlplane (HTTP/2, 127.0.0.1:8081), and the router sends allowed requests on to the
// cluster backend. It needs Envoy 1.33 or later: filter.wasm is built with upstream Go for
// wasip1, and Envoy only loads such modules from the version where proxy-wasm-cpp-host got its
// WASI stubs for sched_yield and poll_oneoff.
//
// There is no Envoy binary in the test environment. Load does the checks Envoy does when it reads
// a bootstrap, using go-control-plane's generated types. It converts the YAML to JSON and
// unmarshals it with protojson, which catches unknown fields, wrong types, bad enum values and
// unresolvable "@type" URLs. It then runs the protoc-gen-validate rules (ValidateAll) on the
// bootstrap and on every typed_config inside it, because those rules stop at google.protobuf.Any.
// Last, it checks that every cluster named by a route or by a sluice plugin configuration is
// defined. Errors give the YAML line or the path of the field that is wrong.
package envoy
