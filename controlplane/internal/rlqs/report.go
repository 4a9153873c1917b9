package rlqs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"sort"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/store"
)

// validate checks a report before anything is changed. domain is the
// stream's domain ("" before its first report). rlqs.proto says a client
// should send domain only in its first report (Envoy sends it in every
// one): a later report may leave it out, but not change it.
func validate(rep *rlqspb.RateLimitQuotaUsageReports, domain string) error {
	switch d := rep.GetDomain(); {
	case d == "" && domain == "":
		return status.Error(codes.InvalidArgument, "rlqs: domain: must not be empty in a stream's first report")
	case d == "":
		// a later report without it: the stream's domain
	case len(d) > MaxDomainLen:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: %d bytes, more than %d", len(d), MaxDomainLen)
	case domain != "" && d != domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: %q, but this stream reports domain %q (one stream, one domain)", d, domain)
	}
	for i, u := range rep.GetBucketQuotaUsages() {
		entries := u.GetBucketId().GetBucket()
		switch {
		case u == nil:
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d]: must not be null", i)
		case len(entries) == 0:
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: must have at least one entry", i)
		case len(entries) > MaxEntries:
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: %d entries, more than %d", i, len(entries), MaxEntries)
		case u.GetTimeElapsed().GetSeconds() < 0 || u.GetTimeElapsed().GetNanos() < 0:
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].time_elapsed: must not be negative", i)
		}
		size := 0
		for k, v := range entries {
			if len(k) > MaxEntryLen || len(v) > MaxEntryLen || k == "" {
				return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: keys must be 1 to %d bytes and values at most %d", i, MaxEntryLen, MaxEntryLen)
			}
			size += len(k) + len(v)
		}
		if size > MaxBucketIDBytes {
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: %d bytes of keys and values, more than %d", i, size, MaxBucketIDBytes)
		}
	}
	return nil
}

// sortedEntries returns a bucket id's entries sorted by key: the
// descriptor they are matched as.
func sortedEntries(id map[string]string) []store.Entry {
	out := make([]store.Entry, 0, len(id))
	for k, v := range id {
		out = append(out, store.Entry{Key: k, Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// bucketKey names a bucket id in its stream's map: the SHA-256 of its
// sorted entries, each length-prefixed (injective before hashing), so that
// the map holds 32 bytes per bucket, not a second copy of the id.
type bucketKey [sha256.Size]byte

// keyOf returns the bucketKey of sorted entries.
func keyOf(entries []store.Entry) bucketKey {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, e := range entries {
		for _, s := range []string{e.Key, e.Value} {
			h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
			h.Write([]byte(s))
		}
	}
	var k bucketKey
	h.Sum(k[:0])
	return k
}

// What a bucket holds beyond its id's keys and values, rounded up from
// TestBucketCost's measures (1,308 bytes with a 22-byte id of 2 entries,
// 6,706 with a 3,990-byte id of 64): the bucket, its map entry, its demand
// key, its entry in the demand and its usage state in the memory store
// (bucketOverhead), and each entry's two string headers (entryOverhead).
const (
	bucketOverhead = 1536
	entryOverhead  = 32
)

// BucketCost is what a bucket of entries costs in the bucket budget
// (Options.MaxBucketBytes): its keys and values and the overheads.
func BucketCost(entries []store.Entry) int64 {
	n := int64(bucketOverhead)
	for _, e := range entries {
		n += int64(entryOverhead + len(e.Key) + len(e.Value))
	}
	return n
}

// handle answers one usage report of st's Envoy.
func (s *Service) handle(ctx context.Context, st *stream, rep *rlqspb.RateLimitQuotaUsageReports) (*rlqspb.RateLimitQuotaResponse, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := validate(rep, st.domain); err != nil {
		return nil, err
	}
	if st.domain == "" {
		st.domain = rep.GetDomain() // a later report may leave it out
	}
	s.m.reports.Inc()
	now := s.opts.Now()
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, u := range rep.GetBucketQuotaUsages() {
		entries := sortedEntries(u.GetBucketId().GetBucket())
		key := keyOf(entries)
		b := st.buckets[key]
		if b == nil {
			if b = s.newBucket(st, entries); b == nil {
				continue
			}
			st.buckets[key] = b
		}
		demand := math.Inf(1) // unknown until two reports
		total := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
		switch elapsed := now.Sub(b.last); {
		case !b.last.IsZero() && elapsed > 0:
			demand = total / elapsed.Seconds()
		case u.GetTimeElapsed().AsDuration() > 0: // whole seconds, may be 0
			demand = total / u.GetTimeElapsed().AsDuration().Seconds()
		}
		b.last = now
		id := &rlqspb.BucketId{Bucket: u.GetBucketId().GetBucket()}
		resp.BucketAction = append(resp.BucketAction, s.assign(ctx, st, b, id, demand, int64(min(u.GetNumRequestsAllowed(), math.MaxInt64)), now))
	}
	return resp, nil
}

// newBucket returns a new bucket of entries for st, or nil when st has
// its maximum of buckets or its client no room in the bucket budget (the
// bucket then gets no assignment). Under st.mu.
func (s *Service) newBucket(st *stream, entries []store.Entry) *bucket {
	cost := BucketCost(entries)
	if len(st.buckets) < s.opts.MaxBuckets && s.budget.take(st.client, cost) {
		return &bucket{entries: entries, cost: cost}
	}
	s.m.refused.Inc()
	if !st.warned {
		st.warned = true
		s.log.Warn("rlqs: a stream has more buckets than allowed (-rlqs-max-buckets, or its connection's share of the bucket budget): the new ones get no assignment",
			"max_buckets", s.opts.MaxBuckets, "max_bucket_bytes", s.opts.MaxBucketBytes, "domain", st.domain, "client", st.client.addr)
	}
	return nil
}

// idOf rebuilds a bucket id from its entries (for abandon_action).
func idOf(entries []store.Entry) *rlqspb.BucketId {
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		m[e.Key] = e.Value
	}
	return &rlqspb.BucketId{Bucket: m}
}
