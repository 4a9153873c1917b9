package policy

import (
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
)

// LeaseMode is the policy file's lease setting.
type LeaseMode string

// The lease settings.
const (
	LeaseAuto LeaseMode = "auto" // lease units from Redis in advance (see controlplane/internal/lease)
	LeaseOff  LeaseMode = "off"  // decide every request in Redis (the default)
)

// FailureMode says what the data plane does with a request when no decision
// can be had (control plane unreachable, or neither Redis nor the memory
// store can answer).
type FailureMode string

// The failure modes.
const (
	FailOpen   FailureMode = "open"   // let the request through (the default)
	FailClosed FailureMode = "closed" // reject it
)

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// Limit is one rate limit as matched for a request. Limits are shared by all
// requests and must not be modified.
//
// A limit configured on a descriptor with a wildcard or without a value
// counts each distinct request descriptor separately (as envoyproxy/ratelimit
// keys its counters by the request's entries): storage keys are built from
// the domain, ID and the request's entries.
type Limit struct {
	// Name is the rate_limit's name ("" if none); replaces refers to it.
	Name string
	// Algorithm is the algorithm; KindUnknown when Unlimited.
	Algorithm algorithms.Kind
	// Requests is requests_per_unit: admitted per Window (token_bucket and
	// gcra: refilled per Window). 0 when Unlimited.
	Requests int64
	// Window is the unit's length or the window given; 0 when Unlimited.
	Window time.Duration
	// Unit is what to report in RLS current_limit: the unit equal to Window,
	// or algorithms.UnitUnknown when Window is not one whole unit.
	Unit algorithms.Unit
	// Burst is the capacity of token_bucket, gcra and reserve (default
	// Requests); 0 for the other algorithms.
	Burst int64
	// MaxWait is reserve's longest wait: a request that would wait longer
	// is refused and takes nothing. 0 for the other algorithms.
	MaxWait time.Duration
	// Calendar, when not nil, makes the windows calendar days, ISO weeks,
	// months or years (Unit) in a time zone (`calendar: Europe/Berlin`)
	// instead of windows of Window from the Unix epoch; Window is then the
	// unit's nominal length (a month's 30 days), which only bounds the
	// arithmetic. Only fixed_window, sliding_window and sliding_log have it.
	Calendar *calendar.Calendar
	// Unlimited means never limited: the descriptor is OK without counting.
	Unlimited bool
	// ShadowMode means evaluate and count, but always answer OK.
	ShadowMode bool
	// QuotaMode is envoyproxy/ratelimit's quota_mode: the limit's
	// descriptor answers OVER_LIMIT on its own, but the request is refused
	// for it only when every quota-mode descriptor of the request is over.
	QuotaMode bool
	// ChargePastLimit makes a request with a cost (hits_addend > 0) take its
	// cost even when it does not fit: usage that already happened, such as
	// the token count Envoy reports at the end of a stream
	// (apply_on_stream_done). See docs/usage-based.md.
	ChargePastLimit bool
	// Metadata is the descriptor's metadata, returned in the answer's
	// dynamic metadata when the request passes it (envoyproxy/ratelimit's
	// RESPONSE_DYNAMIC_METADATA); nil when none. Shared, never modified.
	Metadata *structpb.Struct
	// DetailedMetric is ratelimit's detailed_metric: report metrics per
	// request value rather than per configured descriptor.
	DetailedMetric bool
	// ValueToMetric is ratelimit's value_to_metric: put the request's value
	// in the metric key of a wildcard or key-only descriptor.
	ValueToMetric bool
	// FailureMode is the effective failure mode (descriptor, else its
	// ancestors', else the domain's).
	FailureMode FailureMode
	// Lease is the domain's Lease (`lease: auto`).
	Lease bool
	// ID identifies the limit within its domain, stably across edits that
	// keep its descriptor path: the descriptors' key[=value] path, then "#"
	// and the limit's index on its descriptor, e.g. "user=alice/path#0".
	// '%', '/', '=', '#' and control bytes in keys and values are escaped as
	// %XX, so distinct limits never share an ID.
	ID string
	// Replaces lists the names of limits this one replaces when both match
	// one request.
	Replaces []string
	// Domain is the name of the domain the limit belongs to.
	Domain string
	// Path is the limit's field path in the policy file, e.g.
	// "descriptors[0].rate_limits[1]".
	Path string
	// SharedValues is nil unless a descriptor on the limit's path has
	// share_threshold. Then it has one element per level of the path (per
	// request entry): the wildcard value (e.g. "files*") where that level
	// shares one counter among every value it matches, else "". Counters
	// are keyed by the request's entries with those values put in place of
	// the request's.
	SharedValues []string

	replacedBit int   // index of Name among replaced names, or -1
	replaceBits []int // indexes of the names in Replaces
}

// Descriptor is one configured descriptor, as written in the file.
type Descriptor struct {
	// Key is the descriptor key; never empty.
	Key string
	// Value is "" to match any value, a value with "*" in it to match the
	// values of that pattern (each "*" matches any run of characters), or an
	// exact value.
	Value string
	// Limits are the descriptor's limits (rate_limit or rate_limits); all
	// must pass.
	Limits []*Limit
	// ShadowMode is shadow_mode as written (it applies to this descriptor's
	// limits only, as in envoyproxy/ratelimit).
	ShadowMode bool
	// DetailedMetric is detailed_metric as written.
	DetailedMetric bool
	// ValueToMetric is value_to_metric as written.
	ValueToMetric bool
	// ShareThreshold is share_threshold as written: every request value the
	// wildcard Value matches counts against one counter (only with a
	// wildcard).
	ShareThreshold bool
	// QuotaMode is quota_mode as written (its limits' QuotaMode).
	QuotaMode bool
	// ChargePastLimit is charge_past_limit as written (its limits'
	// ChargePastLimit).
	ChargePastLimit bool
	// Metadata is metadata as written (its limits' Metadata); nil when none.
	Metadata *structpb.Struct
	// FailureMode is failure_mode as written; "" inherits the parent's.
	FailureMode FailureMode
	// Descriptors are the nested descriptors.
	Descriptors []*Descriptor
	// Path is the field path, e.g. "descriptors[0].descriptors[2]".
	Path string
}

// Domain is one domain's policy. It is immutable once parsed.
type Domain struct {
	// Name is the domain.
	Name string
	// FailureMode is the domain's default failure mode (FailOpen unless the
	// file says otherwise).
	FailureMode FailureMode
	// ResponseHeaders turns on the IETF RateLimit-Policy / RateLimit headers.
	ResponseHeaders bool
	// Lease is the policy's `lease: auto`: the control plane takes the
	// domain's leasable limits from Redis in leases of several units and
	// may grant the filter a share (see controlplane/internal/lease). Off by default.
	Lease bool
	// Descriptors are the top-level descriptors.
	Descriptors []*Descriptor
	// Source is the file (or name) the domain was parsed from.
	Source string

	text        []byte   // the document parsed (see Text)
	descriptors int      // how many descriptors, aliases expanded
	root        *level   // match index
	nameLine    int      // line of the domain field
	limits      []*Limit // every limit, in file order
	replaceable int      // how many distinct names some limit replaces
}

// Text returns the document the domain was parsed from, byte for byte (nil
// for a Domain not made by Parse). It is shared: do not modify it.
func (d *Domain) Text() []byte { return d.text }

// DescriptorCount returns how many descriptors the domain has, at every
// level, counting each alias's expansion.
func (d *Domain) DescriptorCount() int { return d.descriptors }

// Limits returns every limit of the domain in file order. The slice is
// shared: do not modify it.
func (d *Domain) Limits() []*Limit { return d.limits }

// Set is an immutable set of domains.
type Set struct {
	domains map[string]*Domain
}

// NewSet returns a set of the given domains. Two domains with one name are an
// error naming both sources.
func NewSet(domains ...*Domain) (*Set, error) {
	s := &Set{domains: make(map[string]*Domain, len(domains))}
	var errs ErrorList
	for _, d := range domains {
		if d == nil {
			continue
		}
		if prev, ok := s.domains[d.Name]; ok {
			errs = append(errs, &Error{File: d.Source, Domain: d.Name, Field: "domain",
				Problem: "duplicate domain (already defined in " + prev.Source + ")"})
			continue
		}
		s.domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

// Domain returns the named domain, or nil if the set has none by that name
// (or the set is nil).
func (s *Set) Domain(name string) *Domain {
	if s == nil {
		return nil
	}
	return s.domains[name]
}

// Len returns the number of domains.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.domains)
}

// Domains returns the domains sorted by name, in a new slice.
func (s *Set) Domains() []*Domain {
	if s == nil {
		return nil
	}
	out := make([]*Domain, 0, len(s.domains))
	for _, d := range s.domains {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// With returns a new set with d added, replacing any domain of the same name.
// s is unchanged.
func (s *Set) With(d *Domain) *Set {
	n := &Set{domains: make(map[string]*Domain, s.Len()+1)}
	if s != nil {
		for k, v := range s.domains {
			n.domains[k] = v
		}
	}
	n.domains[d.Name] = d
	return n
}

// Without returns a new set without the named domain. s is unchanged.
func (s *Set) Without(name string) *Set {
	n := &Set{domains: make(map[string]*Domain, s.Len())}
	if s != nil {
		for k, v := range s.domains {
			if k != name {
				n.domains[k] = v
			}
		}
	}
	return n
}

// unitLength returns u's length, 0 for algorithms.UnitUnknown.
func unitLength(u algorithms.Unit) time.Duration { return time.Duration(u.Seconds()) * time.Second }

// unitOf returns the unit whose length is exactly d, or
// algorithms.UnitUnknown.
func unitOf(d time.Duration) algorithms.Unit {
	if d <= 0 || d%time.Second != 0 {
		return algorithms.UnitUnknown
	}
	return algorithms.UnitOfSeconds(int64(d / time.Second))
}
