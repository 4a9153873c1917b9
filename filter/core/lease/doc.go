// Package lease holds the lease pools' side of the filter: the interface of
// the per-Envoy pools a host implements (Pools), and their renewal before
// they run out (prefetch).
package lease
