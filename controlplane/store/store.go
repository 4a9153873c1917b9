// Package store defines where rate-limit state lives and how one request's
// limits are decided against it. Implementations: memory (package algorithms
// in-process, the embedded default and the rescue limiter) and redis (the
// authoritative Lua scripts).
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
)

// Limit is what a store needs to know about one configured limit.
type Limit struct {
	Algorithm algorithms.Kind
	Requests  int64         // admitted per Window (the refill rate for token_bucket, gcra and reserve)
	Window    time.Duration // window or refill period; a whole number of microseconds
	Burst     int64         // token_bucket, reserve: capacity; gcra: max_burst+1; 0 = Requests
	MaxWait   time.Duration // reserve: the longest wait granted; a whole number of microseconds
	Lease     bool          // the policy's lease: auto (see controlplane/internal/lease); stores ignore it
	// Calendar, when not nil, makes the windows of fixed_window,
	// sliding_window and sliding_log the calendar's periods (days, weeks,
	// months, years in a time zone) instead of clock-aligned windows of
	// Window, which then only bounds the arithmetic (the unit's nominal
	// length). Other algorithms refuse it.
	Calendar *calendar.Calendar
}

// Periods returns the windows of l around now (Unix nanoseconds): the
// calendar's (shared: do not modify them), or nil for windows of fixed
// length.
func (l *Limit) Periods(now int64) *algorithms.Periods {
	if l.Calendar == nil {
		return nil
	}
	return l.Calendar.Periods(now)
}

// ErrCalendar is returned (wrapped) for a calendar on an algorithm that has
// no windows.
var ErrCalendar = errors.New("only fixed_window, sliding_window and sliding_log count by the calendar")

// ValidCalendar reports whether l may have its Calendar.
func ValidCalendar(l *Limit) error {
	if l.Calendar != nil && !l.Algorithm.HasWindows() {
		return fmt.Errorf("%s: %w", l.Algorithm, ErrCalendar)
	}
	return nil
}

// Mode says what a check does with its cost (see package algorithms usage.go).
type Mode uint8

// The modes of a check.
const (
	// Take admits the request and takes its cost if it fits, else refuses it
	// and takes nothing (Allow). A cost of 0 peeks: allowed unless the
	// limiter is past its limit.
	Take Mode = iota
	// Probe asks whether a request of cost 1 would be admitted and takes
	// nothing (Probe): the request-time check of usage charged later. Its
	// Cost must be 0.
	Probe
	// Charge takes the cost even past the limit (Charge): usage that already
	// happened. Cost may exceed the capacity; the debt is bounded at twice
	// the capacity.
	Charge
	// Refund gives the cost back (Refund): capacity taken before and not
	// used (Envoy's is_negative_hits, a settlement's refund). Cost may
	// exceed the capacity: it is clamped at twice it. The result is a peek
	// of the key after the refund.
	Refund
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Take:
		return "take"
	case Probe:
		return "probe"
	case Charge:
		return "charge"
	case Refund:
		return "refund"
	}
	return "unknown"
}

// Check is one limit to decide for one request.
type Check struct {
	Key   string // from Key: identifies the limit's state
	Limit Limit
	Cost  int64 // hits_addend; 0 peeks (Take)
	Mode  Mode  // Take (the zero value), Probe, Charge or Refund
	// Once, when not nil, makes a Charge or a Refund apply at most once per
	// (Once.Token, Key) within the store's dedupe TTL (see Once). Only
	// Charge and Refund checks take it.
	Once *Once
}

// MaxOnceToken bounds the length of Once.Token.
const MaxOnceToken = 128

// Once makes a Charge or Refund check idempotent: the settlement of usage
// that a client may send again (a retry after a lost answer). The first
// check of a (Token, Key) pair within the store's dedupe TTL is applied; a
// later one applies nothing. Either way the check's Result is a Probe of the key
// after it: Allowed reports whether a request of cost 1 would pass now,
// RetryAfter how long until one would, Remaining the true remaining. The
// store sets Duplicate when it did not charge. A Redis store records the
// pair in the key's hash slot in the same script call as the charge.
type Once struct {
	Token     string // 1 to MaxOnceToken bytes, chosen by the client
	Duplicate bool   // set by Decide: the pair was applied before
}

// Store decides checks against shared state.
type Store interface {
	// Decide decides every check, writing out[i] for checks[i]; len(out)
	// must equal len(checks). Each check is decided atomically on its own key;
	// checks of one call are not a transaction across keys (as in
	// envoyproxy/ratelimit, each descriptor is counted independently). An
	// error means no result in out can be trusted.
	Decide(ctx context.Context, checks []Check, out []algorithms.Result) error
	// Name identifies the store in logs and metrics ("memory", "redis").
	Name() string
}

// OnceMark is a store.Once token that a fallback store remembers, for the
// primary to remember as well when it decides again (see
// memory.Store.UnloadOnce): the pair (Token, Key) for Left more.
type OnceMark struct {
	Key, Token string
	Left       time.Duration
}

// ValidOnce reports whether c's Once (if any) is usable: a Charge check
// with a token of 1 to MaxOnceToken bytes.
func ValidOnce(c *Check) error {
	switch {
	case c.Once == nil:
		return nil
	case c.Mode != Charge && c.Mode != Refund:
		return errors.New("once: only a charge or a refund takes a token")
	case len(c.Once.Token) == 0 || len(c.Once.Token) > MaxOnceToken:
		return fmt.Errorf("once: token of %d bytes, want 1 to %d", len(c.Once.Token), MaxOnceToken)
	}
	return nil
}

// ErrInvalidLimit is returned (wrapped) for a check whose limit the
// algorithms refuse.
var ErrInvalidLimit = errors.New("store: invalid limit")

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// Carry is what a fallback store admitted for one key while the primary
// could not decide, for the primary to add to its own state when it answers
// again (see memory.Store.Unload and the Redis store's Carry), so that a
// recovered fleet does not admit a second budget. Base is what the fallback
// was seeded with from the primary's last answer (0 if it was not): the
// primary keeps the larger of its own amount and Base, then adds Used-Base
// (never more than a full limiter). Amounts are as of the moment the Carry
// was taken, and times are durations from that moment, never instants: the
// fallback's clock and the primary's need not agree.
//
//	fixed_window    Left: until the fallback's window ends; Base, Used: its
//	                count. The primary counts it in its own window whose end
//	                is nearest (never a later one than its current window)
//	sliding_window  Left: until the fallback's current window ends (matched
//	                to the primary's windows as for fixed_window); Base,
//	                Used: its count; BasePrev, UsedPrev: the previous
//	                window's count
//	sliding_log     Left: until the newest entry leaves the window; Base,
//	                Used: the log's total (carried as one entry as old as
//	                the newest: it leaves the window no earlier than the
//	                entries it stands for)
//	token_bucket    Base, Used: units missing from a full bucket (tokens
//	                times Window in nanoseconds)
//	gcra            Base, Used: nanoseconds of TAT beyond now
//	reserve         Base, Used: nanoseconds owed (until the free ticket, then
//	                until the store is full again: ResetAfter)
type Carry struct {
	Key                string
	Limit              Limit
	Left               int64 // nanoseconds; see above
	Base, Used         int64
	BasePrev, UsedPrev int64
}
