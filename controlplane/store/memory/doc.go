// Package memory is the in-process store: package algorithms applied to state
// held in this process. It is sluice's embedded default (no Redis configured)
// and the rescue limiter that answers while Redis cannot.
//
// State lives in 64 shards, chosen by a seeded hash of the key, each a map
// under its own mutex. An entry is kept only while its limiter is not full:
// a decision that leaves the limiter full stores nothing, and an entry whose
// ResetAfter has passed is equivalent to a missing one, so Sweep may drop it
// and an access simply reuses it (the algorithms treat an expired state as a
// fresh one).
//
// Memory is bounded twice, per shard: by entries (MaxEntries) and by
// bytes (MaxBytes: what an entry holds on the Go heap, its map slot
// included; a sliding_log entry also holds one 16-byte slot per request of
// its limit). Inserting past either bound evicts the least
// recently used entries of the shard. Eviction forgets a live limiter, which
// then starts full again: the bound trades accuracy for keys nobody has used
// lately against memory that hostile keys could otherwise grow without
// bound. Evictions are counted (Stats) so operators can see it happen.
//
// As the rescue limiter, the store is seeded from Redis's answers (Seed),
// so that it takes over where Redis was, and reports what it admitted
// beyond that (Unload) for Redis to count on its return (carry.go).
package memory
