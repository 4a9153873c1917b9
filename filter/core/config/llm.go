package config

import (
	"math"
	"strconv"

	"github.com/sluicehq/sluice/filter/core/llm"
)

// LLM traffic: rate limits whose usage is an LLM API's tokens. A usage
// object may size its reserve from the request body, read the usage from
// the answer's own usage object (JSON or SSE), count it weighted per model,
// and cut a streamed answer whose budget runs out. Example:
//
//	{"actions": [{"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}],
//	 "usage": {"reserve": 4096, "reserve_from_request": true, "source": {"llm_usage": {}},
//	           "cost": "weighted", "cut": {"slice": 2000}}}
//
// and, at the plugin level, how requests and answers are read:
//
//	"llm": {"max_request_bytes": 65536, "bytes_per_token": 4, "default_max_output": 4096,
//	        "weights": [{"model": "gpt-4o*", "input": 2500000, "output": 10000000, "cached": 1250000},
//	                    {"model": "*", "input": 5000000, "output": 20000000, "cached": 5000000}]}

// Bounds and defaults of the llm object.
const (
	DefaultMaxRequestBytes = 64 << 10
	MaxMaxRequestBytes     = 16 << 20
	DefaultMaxOutput       = 4096
	MinBytesPerToken       = 0.5
	MaxBytesPerToken       = 64
	MinMaxEventBytes       = 1 << 10
	MaxMaxEventBytes       = 64 << 20
	DefaultHoldBytes       = 64 << 10
	MaxHoldBytes           = 1 << 20
)

// CostKind is what a usage-based rate limit counts of an LLM usage.
type CostKind uint8

const (
	// CostTokens counts every token: input, cached, cache writes and
	// output alike.
	CostTokens CostKind = iota
	// CostWeighted counts input*a + output*b + cached*c + cache_write*d
	// with the weights of the request's model (LLM.Weights).
	CostWeighted
)

// LLM configures how the filter reads LLM traffic, for every rate limit
// that does.
type LLM struct {
	// MaxRequestBytes bounds the request body read for a reserve; a longer
	// body gets the rate limit's reserve (counted).
	MaxRequestBytes int64
	// Ratio estimates a prompt's tokens from its text bytes.
	Ratio llm.Ratio
	// DefaultMaxOutput is the output a reserve assumes when a request sets
	// no maximum (max_tokens and the like).
	DefaultMaxOutput int64
	// MaxEventBytes bounds one SSE event of an answer.
	MaxEventBytes int64
	// HoldBytes bounds the bytes of an unfinished SSE event a cut stream's
	// filter holds back until the event is complete.
	HoldBytes int64
	// Weights is the weight table of weighted costs; nil when the
	// configuration gives none.
	Weights *llm.Table
}

// defaultLLM is LLM's defaults.
func defaultLLM() LLM {
	return LLM{MaxRequestBytes: DefaultMaxRequestBytes, Ratio: llm.DefaultRatio, DefaultMaxOutput: DefaultMaxOutput,
		MaxEventBytes: llm.DefaultMaxEventBytes, HoldBytes: DefaultHoldBytes}
}

// Cut configures the cutting of a streamed answer whose budget runs out.
type Cut struct {
	// Slice is how much of the limit a stream draws at a time once its
	// reserve is spent, and how far past what it was granted it may run
	// before it is cut (the overshoot bound of one cut stream).
	Slice int64
}

// decode reads the plugin's llm object.
func (l *LLM) decode(v value, field string) error {
	o, err := asObject(v, field)
	if err != nil {
		return err
	}
	if err := o.only(llmFields...); err != nil {
		return err
	}
	for _, f := range []struct {
		name   string
		lo, hi int64
		dst    *int64
	}{
		{"max_request_bytes", 1, MaxMaxRequestBytes, &l.MaxRequestBytes},
		{"default_max_output", 0, MaxCost, &l.DefaultMaxOutput},
		{"max_event_bytes", MinMaxEventBytes, MaxMaxEventBytes, &l.MaxEventBytes},
		{"hold_bytes", 0, MaxHoldBytes, &l.HoldBytes},
	} {
		if v, ok := o.get(f.name); ok {
			if *f.dst, err = integer(v, o.path(f.name), f.lo, f.hi); err != nil {
				return err
			}
		}
	}
	if v, ok := o.get("bytes_per_token"); ok {
		if l.Ratio, err = bytesPerToken(v, o.path("bytes_per_token")); err != nil {
			return err
		}
	}
	if v, ok := o.get("weights"); ok {
		if l.Weights, err = weights(v, o.path("weights")); err != nil {
			return err
		}
	}
	return nil
}

// bytesPerToken reads a number of bytes per token (up to three decimals)
// as an llm.Ratio.
func bytesPerToken(v value, field string) (llm.Ratio, error) {
	if v.kind != kindNumber {
		return 0, &FieldError{field, "must be a number, not " + v.kind.String()}
	}
	f, err := strconv.ParseFloat(v.text, 64)
	if err != nil || f < MinBytesPerToken || f > MaxBytesPerToken {
		return 0, &FieldError{field, "must be a number of bytes per token between 0.5 and 64, not " + v.text}
	}
	return llm.Ratio(math.Round(f * 1000)), nil
}

// weights reads the llm object's weight table: rows of model, input,
// output, cached and cache_write, validated by llm.NewTable (whose errors
// name the row and the field).
func weights(v value, field string) (*llm.Table, error) {
	if v.kind != kindArray {
		return nil, &FieldError{field, "must be an array, not " + v.kind.String()}
	}
	if len(v.items) > llm.MaxRows {
		return nil, &FieldError{field, "must hold at most " + strconv.Itoa(llm.MaxRows) + " rows"}
	}
	rows := make([]llm.Row, len(v.items))
	for i, item := range v.items {
		o, err := asObject(item, field+"["+strconv.Itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		if err := o.only(weightFields...); err != nil {
			return nil, err
		}
		r := &rows[i]
		if r.Model, err = o.requiredString("model"); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			name string
			dst  *int64
		}{{"input", &r.Input}, {"output", &r.Output}, {"cached", &r.Cached}, {"cache_write", &r.CacheWrite}} {
			v, ok := o.get(f.name)
			if !ok {
				continue
			}
			// The range is llm.NewTable's to check, and to name.
			if *f.dst, err = integer(v, o.path(f.name), math.MinInt64, math.MaxInt64); err != nil {
				return nil, err
			}
			r.HasCacheWrite = r.HasCacheWrite || f.name == "cache_write"
		}
	}
	t, err := llm.NewTable(rows)
	if te, ok := err.(*llm.TableError); ok {
		return nil, &FieldError{field + te.Path(), te.Problem}
	}
	return t, err
}

// llmUsage reads the usage object's LLM fields (reserve_from_request,
// cost, cut) into u, and checks that they fit its source and the plugin's
// llm object.
func (u *Usage) llmUsage(o object, l *LLM) error {
	if v, ok := o.get("reserve_from_request"); ok {
		var err error
		if u.FromRequest, err = asBool(v, o.path("reserve_from_request")); err != nil {
			return err
		}
		if u.FromRequest && u.RequestHeader != "" {
			return &FieldError{o.path("reserve_from_request"), "cannot be set with request_header: both size the reserve"}
		}
	}
	if v, ok := o.get("cost"); ok {
		s, err := asString(v, o.path("cost"))
		if err != nil {
			return err
		}
		switch s {
		case "tokens":
			u.Cost = CostTokens
		case "weighted":
			u.Cost = CostWeighted
		default:
			return &FieldError{o.path("cost"), "must be \"tokens\" or \"weighted\", not " + strconv.Quote(s)}
		}
		if u.Source != SourceLLMUsage {
			return &FieldError{o.path("cost"), "needs the source llm_usage: other sources give one number, not tokens apart"}
		}
		if u.Cost == CostWeighted && l.Weights == nil {
			return &FieldError{o.path("cost"), "\"weighted\" needs the weight table llm.weights"}
		}
	}
	if v, ok := o.get("cut"); ok {
		c, err := asObject(v, o.path("cut"))
		if err != nil {
			return err
		}
		if err := c.only("slice"); err != nil {
			return err
		}
		sv, ok := c.get("slice")
		if !ok {
			return &FieldError{c.path("slice"), "is required"}
		}
		n, err := integer(sv, c.path("slice"), 1, MaxCost)
		if err != nil {
			return err
		}
		if u.Source != SourceLLMUsage {
			return &FieldError{o.path("cut"), "needs the source llm_usage: a stream is counted from its events"}
		}
		u.Cut = &Cut{Slice: n}
	}
	return nil
}

// ReadsLLM reports whether any rate limit reads LLM traffic (its request
// body or its answer's usage).
func (c *Config) ReadsLLM() bool {
	for i := range c.RateLimits {
		if u := c.RateLimits[i].Usage; u != nil && (u.FromRequest || u.Source == SourceLLMUsage) {
			return true
		}
	}
	return false
}

// ReadsRequestBody reports whether any rate limit sizes its reserve from
// the request body.
func (c *Config) ReadsRequestBody() bool {
	for i := range c.RateLimits {
		if u := c.RateLimits[i].Usage; u != nil && u.FromRequest {
			return true
		}
	}
	return false
}
