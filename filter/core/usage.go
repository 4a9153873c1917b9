package core

import (
	"encoding/binary"
	"math"

	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// Usage-based rate limits: reserve at the request, settle at the end.
//
// At request time a usage-based rate limit's descriptor is sent with its
// reserve as cost (or the value of its request_header, when present and a
// whole number), 0 being a probe (a per-descriptor hits_addend 0: refused
// only when not even a cost of 1 fits). The request waits for that call
// only. Usage-based rate limits do not use leases (quotas granted in
// advance are requests of cost 1): a request with a usage-based descriptor
// neither asks for quotas nor spends them.
//
// A request that ran (admitted by the control plane, or let through by the
// failure mode) is armed: its actual cost for each usage-based descriptor
// is read from the configured source as the response goes by (a response
// header on the response headers, a trailer on the trailers, the body's
// bytes counted chunk by chunk, dynamic metadata at stream end), and at
// stream end (Worker.End, or a Worker.Close without it) each descriptor is
// charged actual - reserved, where reserved is what the control plane
// granted it (its request-time cost, and the slices a cut limit drew; 0
// if the failure mode let the request through), or, below 0 and with
// refund, refunded that much: within the window the reserve was taken in
// (a refund in a later window would give back what that window never
// took: it lapses, counted). A charge or refund goes to the settlement
// queue (settling.go). A
// stream whose response did not end (the client went away) is charged per
// on_disconnect (sluice.usage_disconnects); a value missing or malformed,
// per missing (sluice.usage_missing). All of it lives in the exchange,
// which is reset for reuse: nothing remains once the stream is done.

// The states of a stream's cost value for one descriptor.
const (
	valueNone      uint8 = iota // not read (yet)
	valueHave                   // read: a whole number
	valueMalformed              // read, but not a whole number in range
)

// streamUsage is a stream's usage-based state.
type streamUsage struct {
	armed     bool  // the request ran: its settlement is due at stream end
	charged   bool  // the control plane admitted it, so its reserves were charged
	ended     bool  // the response ended (end of stream seen, or a cut)
	settled   bool  // its settlement was made
	llm       bool  // a rate limit reads the answer's usage (tokens.go)
	cut       bool  // a rate limit may cut the answer
	bodyBytes int64 // response body bytes seen
	// Per descriptor of the request (aligned with Exchange.costs): the
	// cost value read and its state.
	values []int64
	states []uint8
}

func (u *streamUsage) reset() {
	u.armed, u.charged, u.ended, u.settled, u.llm, u.cut, u.bodyBytes = false, false, false, false, false, false, 0
	u.values, u.states = u.values[:0], u.states[:0]
}

// arm marks x, whose request ran, when it has usage-based descriptors:
// charged says whether the control plane took their reserves, as resp
// (nil: none) admitted them.
func (st *settler) arm(x *Exchange, charged bool, resp *rlsproto.Response) {
	if x.closed {
		return
	}
	for _, rl := range x.rateLimits {
		if st.cfg.RateLimits[rl].Usage != nil {
			u := &x.usage
			u.armed, u.charged = true, charged
			n := len(x.rateLimits)
			if cap(u.values) < n {
				u.values, u.states = make([]int64, n), make([]uint8, n)
			} else {
				u.values, u.states = u.values[:n], u.states[:n]
				clear(u.values)
				clear(u.states)
			}
			st.budgets(x, charged, resp)
			return
		}
	}
}

// budgets sets what each usage-based descriptor of x, armed, was granted.
func (st *settler) budgets(x *Exchange, charged bool, resp *rlsproto.Response) {
	n := len(x.rateLimits)
	if cap(x.budgets) < n {
		x.budgets = make([]budget, n)
	}
	x.budgets = x.budgets[:n]
	u := &x.usage
	for i, rl := range x.rateLimits {
		b := &x.budgets[i]
		*b = budget{}
		cu := st.cfg.RateLimits[rl].Usage
		if cu == nil {
			continue
		}
		if charged {
			var s *rlsproto.Status
			if resp != nil && len(resp.Statuses) == n {
				s = &resp.Statuses[i]
			}
			b.grant(x.costs[i], s, x.sentAt)
		}
		u.llm = u.llm || cu.Source == config.SourceLLMUsage
		if cu.Cut != nil {
			b.slice, u.cut = cu.Cut.Slice, true
		}
	}
}

// captureHeaders reads x's response-header cost values.
func (st *settler) captureHeaders(x *Exchange, end bool) {
	st.capture(x, config.SourceResponseHeader, false)
	if end {
		x.usage.ended = true
	}
}

// captureTrailers reads x's response-trailer cost values; the trailers end
// the response.
func (st *settler) captureTrailers(x *Exchange) {
	st.capture(x, config.SourceResponseTrailer, true)
	x.usage.ended = true
}

// captureBody counts a chunk of x's response body.
func (st *settler) captureBody(x *Exchange, size int, end bool) {
	if size > 0 {
		x.usage.bodyBytes += int64(size)
	}
	if end {
		x.usage.ended = true
	}
}

// capture reads the values of x's descriptors whose source is src, from
// the response's trailers (trailers) or headers.
func (st *settler) capture(x *Exchange, src config.UsageSource, trailers bool) {
	u := &x.usage
	for i, rl := range x.rateLimits {
		cu := st.cfg.RateLimits[rl].Usage
		if cu == nil || cu.Source != src || u.states[i] == valueHave {
			continue
		}
		var v string
		var ok bool
		if trailers {
			v, ok = x.stream.ResponseTrailer(cu.Name)
		} else {
			v, ok = x.stream.ResponseHeader(cu.Name)
		}
		if !ok {
			continue
		}
		if n, ok := descriptors.ParseCost(v); ok {
			u.values[i], u.states[i] = n, valueHave
		} else {
			u.states[i] = valueMalformed
		}
	}
}

// settleStream computes, at stream end, what each usage-based descriptor
// of an armed exchange x is charged (or refunded) and queues it; x is
// disarmed.
func (st *settler) settleStream(x *Exchange) {
	u := &x.usage
	if !u.armed {
		return
	}
	u.armed, u.settled = false, true
	now := st.host.Now()
	if !u.ended {
		st.count(mUsageDisconnects)
	}
	queued := false
	for i, rl := range x.rateLimits {
		cu := st.cfg.RateLimits[rl].Usage
		if cu == nil {
			continue
		}
		reserved := x.budgets[i].granted
		switch diff := st.actual(x, i, cu, reserved) - reserved; {
		case diff > 0:
			st.charge(x.key(i), diff, now)
			queued = true
		case diff < 0 && cu.Refund:
			queued = st.refund(x, i, -diff, now) || queued
		}
	}
	if u.llm {
		st.w.tokens.account(x)
	}
	if queued {
		st.queued(now)
	}
}

// queued sends what is due once charges were queued at now.
func (st *settler) queued(now int64) {
	st.flush(now)
	// Shorten the tick only if the next one would come after the
	// settlements are due: not once per stream end.
	if due, ok := st.nextDue(); ok && due < st.w.tickAt {
		st.w.schedule(now)
	}
}

// refund queues a refund of n for descriptor i of x, what it was granted
// and did not use, unless the window of its grant has ended (the refund
// lapses, counted); it gives back at most what was granted in that window,
// to the control plane and to the local precheck's bucket alike. It
// reports whether it queued one.
func (st *settler) refund(x *Exchange, i int, n, now int64) bool {
	b := &x.budgets[i]
	if b.until != 0 && now >= b.until {
		st.count(mUsageRefundsLapsed)
		return false
	}
	if n = min(n, b.windowGranted); n <= 0 {
		return false
	}
	b.windowGranted -= n
	st.charge(x.key(i), -n, now)
	st.count(mUsageRefunds)
	st.w.checks.table.Refund(x.key(i), n, now)
	return true
}

// actual returns the actual cost of x's descriptor i, usage-based per cu,
// whose reserve was reserved.
func (st *settler) actual(x *Exchange, i int, cu *config.Usage, reserved int64) int64 {
	u := &x.usage
	switch {
	case !u.ended:
		if cu.OnDisconnect == config.DisconnectBytes {
			return u.bodyBytes
		}
		return reserved
	case cu.Source == config.SourceResponseBodyBytes:
		return u.bodyBytes
	case cu.Source == config.SourceLLMUsage:
		if v, ok := st.w.tokens.actual(x, cu); ok {
			return v
		}
		st.count(mUsageMissing)
		return st.missing(cu, reserved)
	}
	if cu.Source == config.SourceDynamicMetadata {
		if b, ok := x.stream.DynamicMetadata(cu.Namespace, cu.Key); ok {
			if n, ok := parseMetadataCost(b); ok {
				u.values[i], u.states[i] = n, valueHave
			} else {
				u.states[i] = valueMalformed
			}
		}
	}
	if u.states[i] == valueHave {
		return u.values[i]
	}
	st.count(mUsageMissing)
	return st.missing(cu, reserved)
}

// missing is what a stream whose cost value is missing costs, per cu.
func (st *settler) missing(cu *config.Usage, reserved int64) int64 {
	switch cu.Missing {
	case config.MissingZero:
		return 0
	case config.MissingCost:
		return cu.MissingCost
	}
	return reserved
}

// parseMetadataCost parses a dynamic metadata value as the proxy
// serializes it: a string of digits, or a number (protobuf Struct numbers
// are doubles) as its 8 little-endian bytes, which must be a whole number
// from 0 to config.MaxCost. The two cannot be confused: a double whose 8
// bytes are all ASCII digits is below 1e-30.
func parseMetadataCost(b []byte) (int64, bool) {
	digits := len(b) > 0
	for _, c := range b {
		if c < '0' || c > '9' {
			digits = false
			break
		}
	}
	if digits {
		return descriptors.ParseCost(string(b))
	}
	if len(b) != 8 {
		return 0, false
	}
	f := math.Float64frombits(binary.LittleEndian.Uint64(b))
	if !(f >= 0) || f > config.MaxCost || f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}
