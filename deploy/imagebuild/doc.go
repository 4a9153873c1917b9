// Package imagebuild builds sluice's container images without a Docker
// daemon, with go-containerregistry: the control plane for linux/amd64 and
// linux/arm64, from scratch; filter.wasm as a Wasm image (the compat
// variant that Istio's WasmPlugin and Envoy Gateway's EnvoyExtensionPolicy
// pull); and the native filter, libsluice.so, for linux/amd64 and
// linux/arm64 (an image to mount as a volume into Envoy's pod; its cgo
// builds need a C compiler per platform). It writes them as OCI image
// layouts and pushes them to a registry.
//
// The images are reproducible: every timestamp is Meta.Created, tar entries
// are sorted and owned by fixed ids, gzip headers carry no name or time, and
// the binaries are built with -trimpath, -buildvcs=false and -buildid=, so
// two builds of one commit with one Go toolchain (and, for the native
// module, one C compiler) have one digest.
package imagebuild
