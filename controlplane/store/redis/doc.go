// Package redisstore is sluice's authoritative store: rate-limit state in
// Redis (standalone, Sentinel or Cluster, through a go-redis UniversalClient),
// decided by Lua ports of package algorithms.
//
// # Scripts
//
// One .lua file per algorithm (fixed_window is clock-aligned, as in
// envoyproxy/ratelimit) sits beside this file; each is a line-by-line port of
// its Go counterpart on microseconds, Redis's TIME unit, with the same integer
// arithmetic. Lua numbers are doubles, exact for integers below 2^53, so
// Decide refuses limits whose intermediate values could leave that range (see
// luaBounds). The files are joined into one script that decides every key of
// a call, so one script call answers a whole request, or many concurrent
// requests. On Redis 7 and later the same parts are loaded once as a function
// library and called with FCALL; EVALSHA is the fallback (see
// Options.NoFunctions), and RATIONALE.md says why.
// The clock is Redis TIME, read once per script call; Options.Now injects a
// time instead, for tests. Every written key gets a PEXPIRE at the moment its
// state would be back to "fresh" anyway (ceil of the reset time in
// milliseconds, plus one), so idle keys vanish; the logic never depends on it.
// (fixed_window keeps the expiry its window's first write set: see
// fixed_window.lua.) A denied request takes nothing and leaves the state as
// it was: it writes nothing, except that fixed_window counts first and takes
// the cost back in the same script call, and sliding_log drops entries that
// have left the window, as its Go counterpart does. A server that lost the
// script (SCRIPT FLUSH, restart, failover) answers NOSCRIPT, or for the
// library "Function not found", and the call is repeated once with EVAL,
// which loads the script (and the library is loaded again). Redis 5 or newer
// (the scripts write after reading TIME, which needs effect replication).
//
// # Units
//
// Results come back in nanoseconds (microseconds times 1000). Against the
// nanosecond Go algorithms on the same whole-microsecond inputs: fixed_window
// and sliding_log give identical results; token_bucket and sliding_window
// identical Allowed and Remaining, and durations that are the Go ones rounded
// up to a whole microsecond; gcra rounds its emission interval (period/count)
// down to a whole microsecond, where Go in nanoseconds rounds it down to a
// nanosecond, so the two agree exactly only when the period in microseconds
// is a multiple of count. TestRoundingRule checks all of this.
//
// # Round trips and batching
//
// Decide calls that arrive while MaxInFlight script round trips are under way
// queue, and are sent together, up to MaxBatch checks per script call, as
// soon as one round trip ends: under light load a call goes out at once, under
// heavy load the script's fixed cost (10-20 us of Redis CPU) is shared. On
// a standalone or Sentinel client one script call takes keys of any slot. On
// a Cluster (or Ring) client, a script call may only touch one hash slot, so
// checks are grouped by their keys' hash tags (store.Key puts each limit's
// hash in one) and the group's script calls are pipelined: one round trip per
// node.
//
// The script calls are marked as not retryable: a script that ran but whose
// reply was lost must not run again, or it would count twice. go-redis still
// retries what cannot have run (dial errors, MOVED, ASK).
//
// # Deadlines
//
// Decide returns when ctx is done, whatever the round trip is doing. The
// round trip itself ends on go-redis's read and write timeouts, or on the
// latest deadline of the calls it carries when the client has
// ContextTimeoutEnabled; set that and a ReadTimeout near the decision
// deadline so that a stalled server frees its round trips quickly.
package redisstore
