// Package connbounds holds what the control plane's listeners allow their
// connections: one set of defaults (Default) that every listener starts
// from, the decision port in both server modes, RLQS, the policy service
// and the HTTP listeners, and the few bounds a listener changes for what it
// serves (RLQS, Operator). It also holds the thresholds at which the HTTP/2
// servers close a connection that floods them with frames.
//
// Each listener takes these and enforces them its own way (package
// grpcunary on the unary decision port; grpc-go's options, the frame guard
// and the stream budget of package server on the others), so that a bound
// has one value wherever it applies. docs/controlplane.md ("Bounds") lists
// them for users.
package connbounds
