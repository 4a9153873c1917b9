// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService), the protocol of
// Envoy's own envoy.filters.http.rate_limit_quota filter, from sluice's
// policies and store.
//
// An Envoy keeps one stream open and reports, per bucket, the requests it
// allowed and denied; the service answers each report with an assignment
// per bucket. A bucket id's entries are a request descriptor: sorted by key,
// they are matched against the policy of the report's domain
// (policy.Domain.Match). The limit's rate (requests_per_unit per unit) is
// divided among the Envoys that report the bucket (Grant): each takes what
// the others' assignments in force leave free, up to its demand, and one
// left below its max-min fair share (Shares) borrows the difference from the
// usage budget; each Envoy gets a token bucket of its share. The Envoys'
// demand and assignments are kept in Redis when the control plane has
// Redis (RedisDemand), so that replicas divide one rate among all the
// Envoys; the usage each Envoy reports is debited from a token bucket of
// the limit's rate in the store (the usage budget, 10 s of the rate), and
// an Envoy whose usage finds that bucket empty is told to deny all until
// its next report.
//
// A stream that closes releases its shares at once, so that a newcomer of a
// rolling restart gets the departed Envoy's share at its first report; a
// newcomer that finds the rate held borrows its fair share. Both can admit
// more than the limit for a while: a loan, until the others make room at
// their next reports (one report interval), and a released share whose
// Envoy in fact runs on (its stream broke; it reopens one at its next
// report). The usage budget bounds both: loans are taken from it when
// lent, and every report's usage is debited from it (one report interval
// late at most), so over any window the Envoys admit at most the budget,
// 10 s of the limit, beyond the limit (measured in TestBrokenStreamBound). A server that stops calls Drain
// first: its streams' Envoys run on, so their shares are kept one more
// report interval.
//
// Envoy 1.40 reports every 5 s whatever reporting_interval says, reads only
// the seconds of assignment_time_to_live and of token_bucket.fill_interval,
// and ignores requests_per_time_unit: assignments are token buckets or
// blanket rules with whole-second intervals and time-to-live values of
// several report intervals (Options.TTL). A token bucket means the same rate
// to Envoy and to a client that reads token_bucket.proto literally (see
// TokenBucket). Only a stream's first report must carry its domain.
//
// What the service holds is bounded: a bucket id (MaxEntries, MaxEntryLen,
// MaxBucketIDBytes; kept once, keyed by its digest), the buckets of a
// stream (Options.MaxBuckets) and of all streams (Options.MaxBucketBytes,
// shared fairly among connections: a bucketBudget).
package rlqs
