// Package degrade keeps decisions flowing when the authoritative store
// (Redis) fails: it wraps a primary and a fallback store.Store (the memory
// store, go-zero's "rescue limiter" idea).
//
// Each Decide goes to the primary with a deadline (20 ms by default). When
// the primary errors or misses the deadline, the same call is answered by
// the fallback at once. Only a sustained failure (see Trip: failures in a
// row, or a failure ratio over a short window) turns the Store degraded:
// later calls then go straight to the fallback, without waiting on the
// primary, while a background probe (a PING through the function the caller
// passes) runs every ProbeInterval. The first probe that succeeds switches
// decisions back to the primary. One late answer therefore switches nothing.
//
// While degraded each replica limits on its own: limits hold per replica,
// not across the fleet. That is the price of answering at all. Two things
// keep an outage from handing out fresh budgets (see recover.go): the
// fallback starts from the primary's last answers (a fallback with a Seed
// method is told every answer of the primary), and on the way back what
// the fallback admitted is added to the primary's state (a fallback with an
// Unload method, a primary with a Carry method: the memory and Redis
// stores) before and right after decisions return to the primary, with
// the settlement tokens (store.Once) the fallback remembers (UnloadOnce,
// MarkOnce), so that a retried settlement is not charged twice.
//
// When the fallback fails too, Decide returns the error; the caller then
// applies each limit's failure mode.
package degrade
