package config

import (
	"strconv"
	"strings"
)

// Usage-based limits: a rate limit with a usage object reserves
// a cost at request time and settles the actual cost, taken from the
// response, when the stream ends. Example:
//
//	{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
//	 "usage": {"reserve": 1, "source": {"response_trailer": "x-usage-tokens"},
//	           "missing": "reserve", "on_disconnect": "reserve"}}
//
// and, at the plugin level, how settlements are sent:
//
//	"settle": {"batch_max": 64, "interval_ms": 100, "queue_max": 4096, "timeout_ms": 1000}

// Bounds and defaults of usage and settle.
const (
	DefaultReserve        = 1
	MaxCost               = 1<<53 - 1 // a cost (reserve, missing, a value read), exact in a double
	DefaultSettleBatchMax = 64
	MaxSettleBatchMax     = 64 // descriptors per settle call (the control plane's limit)
	DefaultSettleInterval = 100
	MaxSettleInterval     = 60000
	DefaultSettleQueueMax = 4096
	MaxSettleQueueMax     = 65536
	DefaultSettleTimeout  = 1000
	MaxSettleTimeout      = 60000
)

// UsageSource is where a stream's actual cost is read.
type UsageSource uint8

const (
	// SourceResponseHeader is a response header holding a whole number.
	SourceResponseHeader UsageSource = iota + 1
	// SourceResponseTrailer is a response trailer holding a whole number.
	SourceResponseTrailer
	// SourceDynamicMetadata is a value of the stream's dynamic metadata
	// (filter_metadata[Namespace][Key]), a number or a string of digits.
	SourceDynamicMetadata
	// SourceResponseBodyBytes is the number of bytes of the response body.
	SourceResponseBodyBytes
	// SourceLLMUsage is the usage object of an LLM API's answer, JSON or
	// SSE by its content type (package llm), counted per Usage.Cost.
	SourceLLMUsage
)

// MissingOutcome is what a stream whose cost value is missing or malformed
// is charged.
type MissingOutcome uint8

const (
	// MissingReserve charges the reserve only: nothing more.
	MissingReserve MissingOutcome = iota
	// MissingZero takes the actual cost as 0 (the reserve is refunded,
	// with Usage.Refund).
	MissingZero
	// MissingCost takes the actual cost as Usage.MissingCost.
	MissingCost
)

// DisconnectOutcome is what a stream whose client went away before the
// response ended is charged.
type DisconnectOutcome uint8

const (
	// DisconnectReserve charges the reserve only: nothing more.
	DisconnectReserve DisconnectOutcome = iota
	// DisconnectBytes takes the actual cost as the response body bytes
	// sent so far.
	DisconnectBytes
)

// Usage is a rate limit's usage-based cost.
type Usage struct {
	Reserve       uint32      // cost asked at request time; 0 = a probe
	Source        UsageSource // where the actual cost is read
	Name          string      // SourceResponseHeader, SourceResponseTrailer: the lower-case header name
	Namespace     string      // SourceDynamicMetadata: the metadata namespace
	Key           string      // SourceDynamicMetadata: the key in it
	RequestHeader string      // optional: a request header whose value replaces Reserve; lower case
	Missing       MissingOutcome
	MissingCost   int64 // with MissingCost
	OnDisconnect  DisconnectOutcome
	// Refund gives back, at stream end, what was reserved and not used
	// (a settlement's is_negative_hits); without it a stream is charged
	// max(0, actual - reserved).
	Refund bool
	// FromRequest sizes the reserve from the request body (package llm:
	// the prompt's estimate plus the maximum output); Reserve is then the
	// reserve of a body that cannot be read (too long, not JSON).
	FromRequest bool
	// Cost is what an LLM usage counts (SourceLLMUsage).
	Cost CostKind
	// Cut, when set, cuts a streamed answer whose budget runs out
	// (SourceLLMUsage).
	Cut *Cut
}

// Settle configures how the plugin sends settlements.
type Settle struct {
	BatchMax   int // descriptors per settle call, 1-64
	IntervalMs int // how long a settlement may wait to share a call; 0 = sent at stream end
	QueueMax   int // settlements waiting (not yet in a call) per plugin instance; past it they are lost
	TimeoutMs  int // deadline of one settle call
}

// defaultSettle is Settle's defaults.
var defaultSettle = Settle{BatchMax: DefaultSettleBatchMax, IntervalMs: DefaultSettleInterval,
	QueueMax: DefaultSettleQueueMax, TimeoutMs: DefaultSettleTimeout}

// usage reads a rate limit's usage object; l is the plugin's llm object.
func usage(v value, field string, l *LLM) (*Usage, error) {
	o, err := asObject(v, field)
	if err != nil {
		return nil, err
	}
	if err := o.only(usageFields...); err != nil {
		return nil, err
	}
	u := &Usage{Reserve: DefaultReserve, Refund: true}
	if v, ok := o.get("reserve"); ok {
		n, err := integer(v, o.path("reserve"), 0, 1<<32-1)
		if err != nil {
			return nil, err
		}
		u.Reserve = uint32(n)
	}
	sv, ok := o.get("source")
	if !ok {
		return nil, &FieldError{o.path("source"), "is required"}
	}
	if err := u.source(sv, o.path("source")); err != nil {
		return nil, err
	}
	if v, ok := o.get("request_header"); ok {
		name, err := nonEmptyString(v, o.path("request_header"))
		if err != nil {
			return nil, err
		}
		if !validHeaderName(name) || strings.HasPrefix(name, ":") {
			return nil, &FieldError{o.path("request_header"), "is not a valid header name: " + strconv.Quote(name)}
		}
		u.RequestHeader = strings.ToLower(name)
	}
	if v, ok := o.get("missing"); ok {
		if err := u.missing(v, o.path("missing")); err != nil {
			return nil, err
		}
	}
	if v, ok := o.get("on_disconnect"); ok {
		s, err := asString(v, o.path("on_disconnect"))
		if err != nil {
			return nil, err
		}
		switch s {
		case "reserve":
			u.OnDisconnect = DisconnectReserve
		case "bytes":
			u.OnDisconnect = DisconnectBytes
		default:
			return nil, &FieldError{o.path("on_disconnect"), "must be \"reserve\" or \"bytes\", not " + strconv.Quote(s)}
		}
	}
	if v, ok := o.get("refund"); ok {
		if u.Refund, err = asBool(v, o.path("refund")); err != nil {
			return nil, err
		}
	}
	if err := u.llmUsage(o, l); err != nil {
		return nil, err
	}
	return u, nil
}

// source reads usage.source: an object with exactly one member.
func (u *Usage) source(v value, field string) error {
	o, err := asObject(v, field)
	if err != nil {
		return err
	}
	if len(o.v.members) != 1 {
		return &FieldError{field, "must have exactly one of " + strings.Join(usageSourceFields, ", ")}
	}
	m := o.v.members[0]
	path := o.path(m.name)
	switch m.name {
	case "response_header", "response_trailer":
		name, err := nonEmptyString(m.value, path)
		if err != nil {
			return err
		}
		if !validHeaderName(name) || strings.HasPrefix(name, ":") {
			return &FieldError{path, "is not a valid header name: " + strconv.Quote(name)}
		}
		u.Name = strings.ToLower(name)
		u.Source = SourceResponseHeader
		if m.name == "response_trailer" {
			u.Source = SourceResponseTrailer
		}
	case "dynamic_metadata":
		md, err := asObject(m.value, path)
		if err != nil {
			return err
		}
		if err := md.only(dynamicMetadataFields...); err != nil {
			return err
		}
		if u.Namespace, err = md.requiredString("namespace"); err != nil {
			return err
		}
		if u.Key, err = md.requiredString("key"); err != nil {
			return err
		}
		if strings.IndexByte(u.Namespace, 0) >= 0 || strings.IndexByte(u.Key, 0) >= 0 {
			return &FieldError{path, "namespace and key must not contain NUL"}
		}
		u.Source = SourceDynamicMetadata
	case "response_body_bytes":
		body, err := asObject(m.value, path)
		if err != nil {
			return err
		}
		if err := body.only(); err != nil {
			return err
		}
		u.Source = SourceResponseBodyBytes
	case "llm_usage":
		body, err := asObject(m.value, path)
		if err != nil {
			return err
		}
		if err := body.only(); err != nil {
			return err
		}
		u.Source = SourceLLMUsage
	default:
		return &FieldError{path, "is not a known source (" + strings.Join(usageSourceFields, ", ") + ")"}
	}
	return nil
}

// missing reads usage.missing: "reserve", "zero" or a whole number.
func (u *Usage) missing(v value, field string) error {
	switch v.kind {
	case kindString:
		switch v.text {
		case "reserve":
			u.Missing = MissingReserve
		case "zero":
			u.Missing = MissingZero
		default:
			return &FieldError{field, "must be \"reserve\", \"zero\" or a number, not " + strconv.Quote(v.text)}
		}
	case kindNumber:
		n, err := integer(v, field, 0, MaxCost)
		if err != nil {
			return err
		}
		u.Missing, u.MissingCost = MissingCost, n
	default:
		return &FieldError{field, "must be \"reserve\", \"zero\" or a number, not " + v.kind.String()}
	}
	return nil
}

// decode reads the plugin's settle object.
func (s *Settle) decode(v value, field string) error {
	o, err := asObject(v, field)
	if err != nil {
		return err
	}
	if err := o.only(settleFields...); err != nil {
		return err
	}
	for _, f := range []struct {
		name   string
		lo, hi int64
		dst    *int
	}{
		{"batch_max", 1, MaxSettleBatchMax, &s.BatchMax},
		{"interval_ms", 0, MaxSettleInterval, &s.IntervalMs},
		{"queue_max", 1, MaxSettleQueueMax, &s.QueueMax},
		{"timeout_ms", 1, MaxSettleTimeout, &s.TimeoutMs},
	} {
		if v, ok := o.get(f.name); ok {
			n, err := integer(v, o.path(f.name), f.lo, f.hi)
			if err != nil {
				return err
			}
			*f.dst = int(n)
		}
	}
	return nil
}

// HasUsage reports whether any rate limit is usage-based.
func (c *Config) HasUsage() bool {
	for i := range c.RateLimits {
		if c.RateLimits[i].Usage != nil {
			return true
		}
	}
	return false
}
