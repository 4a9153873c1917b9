// Package lease puts leases in front of the Redis store: for limits whose
// policy says `lease: auto`, a replica debits several units of a key in one
// script call (redisstore.Store.Lease) and then admits that many requests
// without asking Redis, until the units are spent or the lease's validity
// ends. Whatever it admits locally was debited in Redis first, so leases
// never admit more than the algorithm would (see lease.lua for why that is
// exact for each algorithm); what they can do is admit less: units leased
// and not spent are lost to everyone until they expire with their window
// (fixed_window, sliding_window) or are given back (token_bucket, gcra,
// return.lua). The bound is stated in the README: at any moment, at most the
// units outstanding in leases, and for token_bucket and gcra also the refill
// each lease forgoes during its validity (at most its own size).
//
// A lease's size (Policy.Size) follows the key's observed rate and shrinks
// as the remaining budget gets small, down to 1: then the check goes to the
// Redis store's per-request path, exactly as without leases. sliding_log is
// never leased, nor a check of cost other than 1.
//
// A replica can also hand part of its lease to a data plane (Share): the
// filter then spends it without a callout (RLS DescriptorStatus.quota).
package lease
