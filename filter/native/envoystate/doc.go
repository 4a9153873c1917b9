// Package envoystate is the native host's per-Envoy state: the precheck's
// over-limit blocks (core.Blocks) and the lease pools (lease.Pools) that
// every worker thread of one Envoy shares, held in the process's memory.
// Envoy runs one Go runtime for all its workers (one module, loaded once),
// so what proxy-wasm keeps in shared data behind the host's global lock is
// plain Go memory here.
//
// Each domain has a fixed table of slots per kind (Slots of each), the slot
// of a descriptor picked by a hash of its key from a seed drawn once per
// process; a slot holds the full key, so a collision only loses an entry
// (the worker then asks the control plane), never answers for another key.
// The memory is bounded whatever the traffic: Bound.
//
// No worker waits on another for longer than one slot's work:
//   - a block slot is an atomic pointer to an immutable entry: a read is a
//     load, a write a compare-and-swap (at most MaxAttempts);
//   - a lease slot has a mutex of its own, held for a few comparisons and
//     additions; a slot no pool uses is skipped by an atomic read, without
//     the lock, so that leases that cannot help cost nothing.
//
// A domain's state lives while a filter configuration uses it (Acquire,
// Release): an Envoy that replaces a listener (an LDS update) creates the
// new configuration before it drops the old one, so the blocks and pools
// of its domains survive the update. A new Envoy process (a hot restart)
// starts with none.
package envoystate
