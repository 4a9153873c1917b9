package rlqs

import (
	"sort"
	"strconv"
	"strings"

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
		for k, v := range entries {
			if len(k) > MaxEntryLen || len(v) > MaxEntryLen || k == "" {
				return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: keys must be 1 to %d bytes and values at most %d", i, MaxEntryLen, MaxEntryLen)
			}
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

// bucketKey is a canonical, injective name of a bucket id (sorted entries,
// each length-prefixed).
func bucketKey(entries []store.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		for _, s := range []string{e.Key, e.Value} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}
