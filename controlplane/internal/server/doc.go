// Package server wires sluice's control plane together: the store (Redis
// behind the degradation wrapper, or the embedded memory store), the RLS
// decision service on a gRPC listener, and an HTTP listener with /metrics
// (Prometheus), /healthz and /readyz. Run serves until its context ends and
// then shuts down gracefully.
//
// Readiness has two audiences. /readyz, for the orchestrator, answers 200
// while the server serves decisions, degraded or not, and 503 while starting
// and while draining; its body says whether decisions come from Redis or, in
// degradation, from this replica's memory store. A Redis outage degrades
// every replica at once: were they unready, Kubernetes would take them all
// out of the Service and the filters would fall to their failure mode
// instead of the degraded limits. The standard gRPC health service, for the
// empty service name and for the RLS service, is for Envoy's active health
// checking: it also reports NOT_SERVING while degraded, so that Envoy
// prefers replicas that still reach Redis (in a partition) and, when all are
// degraded, its panic threshold keeps sending to all of them. /healthz
// answers 200 as long as the process serves HTTP.
package server
