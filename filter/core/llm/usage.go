package llm

import "math/bits"

// MaxTokens is the largest token count or cost this package gives:
// 2^53-1, exact in a double (Redis' Lua numbers, JSON decoders in other
// languages). Sums and products saturate at it.
const MaxTokens = 1<<53 - 1

// Usage is what one answer consumed, in tokens, split as the providers
// bill it. The three input parts do not overlap: their sum is the prompt.
type Usage struct {
	Input      int64 // input tokens not read from a cache
	Cached     int64 // input tokens read from a cache
	CacheWrite int64 // input tokens written to a cache (Anthropic's cache_creation_input_tokens)
	Output     int64 // output tokens (reasoning included)
}

// Total is every token of u, saturating at MaxTokens.
func (u Usage) Total() int64 {
	return addSat(addSat(u.Input, u.Cached), addSat(u.CacheWrite, u.Output))
}

// addSat adds two counts in [0, MaxTokens], saturating at MaxTokens.
func addSat(a, b int64) int64 {
	if a > MaxTokens-b {
		return MaxTokens
	}
	return a + b
}

// mulSat multiplies two counts in [0, MaxTokens], saturating at MaxTokens.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > MaxTokens {
		return MaxTokens
	}
	return int64(lo)
}

// Ratio turns text bytes into estimated tokens: thousandths of a byte per
// token (4000: 4 bytes a token, OpenAI's rule of thumb for English; code
// and other languages run lower, so an operator tunes it).
type Ratio uint32

// DefaultRatio is 4 bytes a token.
const DefaultRatio Ratio = 4000

// Tokens estimates the tokens of n bytes of text, rounding up so that any
// text counts; a zero Ratio is DefaultRatio.
func (r Ratio) Tokens(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if r == 0 {
		r = DefaultRatio
	}
	hi, lo := bits.Mul64(uint64(n), 1000)
	if hi >= uint64(r) { // the quotient would not fit in 64 bits
		return MaxTokens
	}
	q, rem := bits.Div64(hi, lo, uint64(r))
	if rem != 0 {
		q++
	}
	if q > MaxTokens {
		return MaxTokens
	}
	return int64(q)
}

// UsageStatus is how much of an answer's usage was read.
type UsageStatus uint8

const (
	// UsageMissing: no usage object was found (the stream did not ask for
	// it, was cut, or the body was not JSON). The caller applies its
	// configured missing outcome.
	UsageMissing UsageStatus = iota
	// UsagePartial: only counts that are not final were found: Anthropic's
	// message_start without the message_delta that ends a message (input
	// is known, output is a lower bound), or a final usage without its
	// input or output count.
	UsagePartial
	// UsageComplete: the final counts of input and output were found.
	UsageComplete
	// UsageMalformed: a usage count was not a whole number in
	// [0, MaxTokens]. The caller applies its configured missing outcome.
	UsageMalformed
)

// String names the status as metrics and logs do.
func (s UsageStatus) String() string {
	switch s {
	case UsagePartial:
		return "partial"
	case UsageComplete:
		return "complete"
	case UsageMalformed:
		return "malformed"
	default:
		return "missing"
	}
}

// Stats counts what a reader met in an answer.
type Stats struct {
	Bytes     int64 // body bytes written
	Events    int64 // SSE events with data
	Oversized int64 // SSE events longer than the reader's MaxEventBytes: skipped
	Malformed int64 // SSE events (or a JSON body) whose data was not one complete JSON object
	Errors    int64 // events (or a body) in which the provider reported an error
	Done      bool  // OpenAI chat's "data: [DONE]" was seen
}

// Result is what a reader read from an answer.
type Result struct {
	Usage  Usage // meaningful when Status is UsageComplete or UsagePartial
	Status UsageStatus
	Stats  Stats
}

// The raw usage counts, as the providers name them, in the order of the
// answer schema's slots.
const (
	rawInput      = iota // prompt_tokens, input_tokens
	rawOutput            // completion_tokens, output_tokens
	rawCachedPart        // OpenAI's *_tokens_details.cached_tokens: a part of the input count
	rawCacheRead         // Anthropic's cache_read_input_tokens: apart from input_tokens
	rawCacheWrite        // Anthropic's cache_creation_input_tokens
	rawCount
)

// usageAcc gathers an answer's usage counts, each field the last value
// seen, and says what the whole amounts to.
type usageAcc struct {
	v         [rawCount]int64
	seen      uint8 // bit i: v[i] was found
	final     bool  // a final usage object was found
	malformed bool  // a count was not a whole number in range
}

// result normalizes the counts: OpenAI's cached tokens are a part of its
// input count, Anthropic's are apart from it.
func (a *usageAcc) result() (Usage, UsageStatus) {
	if a.malformed {
		return Usage{}, UsageMalformed
	}
	if a.seen == 0 {
		return Usage{}, UsageMissing
	}
	u := Usage{
		Input:      a.v[rawInput] - a.v[rawCachedPart],
		Cached:     addSat(a.v[rawCachedPart], a.v[rawCacheRead]),
		CacheWrite: a.v[rawCacheWrite],
		Output:     a.v[rawOutput],
	}
	if u.Input < 0 {
		u.Input = 0
	}
	const both = 1<<rawInput | 1<<rawOutput
	if a.final && a.seen&both == both {
		return u, UsageComplete
	}
	return u, UsagePartial
}
