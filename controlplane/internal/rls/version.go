package rls

import (
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// version is one policy set and what decisions derive from its limits,
// computed once when the set is installed rather than on every request.
type version struct {
	set    *policy.Set
	months *calendar.Calendar           // Options.CalendarMonths
	info   map[*policy.Limit]*limitInfo // every limit of every domain of set
	wire   wireCache                    // the encodings of the shared metadata (see Codec)
}

// limitInfo is what a decision needs of one limit besides the limit itself.
// Its protobuf messages are shared by every response that reports the limit
// and must never be modified (marshalling only reads them).
type limitInfo struct {
	store    store.Limit                        // the limit as the store decides it
	capacity int64                              // the largest cost the limit can allow
	current  *rlsv3.RateLimitResponse_RateLimit // the status's current_limit
	meta     *structpb.Value                    // the descriptor's metadata while not over limit
	single   *structpb.Struct                   // the dynamic_metadata of a one-descriptor response not over limit
	rules    *ruleMetrics                       // where the limit's statistics are; nil for a request's override
	rule     atomic.Pointer[ruleCounters]       // the limit's statistics, once it was first checked (see counters)
}

// newVersion derives the limit information of every limit of set, with
// its statistics' counters from rules (none when rules is nil).
func newVersion(set *policy.Set, rules *ruleMetrics, months *calendar.Calendar) *version {
	v := &version{set: set, months: months, info: map[*policy.Limit]*limitInfo{}}
	v.wire.addValue(emptyValue)
	v.wire.addStruct(emptySingle)
	for _, d := range set.Domains() {
		for _, l := range d.Limits() {
			i := newLimitInfo(l, months)
			i.rules = rules
			v.info[l] = i
			v.wire.addValue(i.meta)
			v.wire.addStruct(i.single)
		}
	}
	return v
}

// counters returns the statistics of the request entries' check against
// l: the rule's, or, for a detailed rule, the request value's; nil for a
// request's override.
func (i *limitInfo) counters(l *policy.Limit, entries []*ratelimitv3.RateLimitDescriptor_Entry) *ruleCounters {
	switch {
	case i.rules == nil:
		return nil
	case perValue(l):
		return i.rules.forValue(l, entries)
	}
	return i.rules.forRule(l, &i.rule)
}

// infoOf returns the information of l: precomputed for the set's limits,
// computed now for a request's limit override.
func (v *version) infoOf(l *policy.Limit) *limitInfo {
	if i := v.info[l]; i != nil {
		return i
	}
	return newLimitInfo(l, v.months)
}

// newLimitInfo computes the information of l (months: see storeLimit).
func newLimitInfo(l *policy.Limit, months *calendar.Calendar) *limitInfo {
	sl := storeLimit(l, months)
	i := &limitInfo{store: sl, capacity: capacity(sl), current: currentLimit(l)}
	i.meta = metadataValue(&outcome{lim: l, info: i, res: algorithms.Result{Allowed: true}})
	i.single = metadataStruct([]*structpb.Value{i.meta})
	return i
}
