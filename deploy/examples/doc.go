// Package examples holds Kubernetes manifests for running sluice with plain
// Envoy, Istio and Envoy Gateway (plain-envoy/, istio/, envoy-gateway/), and
// the tests that decode each strictly, parse the plugin configurations with
// the filter's own parser, check the Envoy configuration they carry, and
// check that they name the images of this version.
package examples
