// Package logthrottle limits repeated log lines: a slog.Handler that lets the
// first Burst records with the same level and message through in each
// Interval, drops the rest, and then writes one summary record saying how
// many it dropped.
//
// Log lines that an outside client can trigger (a refused credential, a
// failing store answered per call) would otherwise let that client fill the
// disk and drown the lines that matter: 20,000 wrong-token calls wrote 20,000
// lines in 2.6 s. Messages are constant strings in sluice, so the level and
// message identify "the same line"; the attributes (peer, reason) differ and
// are not part of the key.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults for Options.
const (
	DefaultBurst    = 10
	DefaultInterval = 10 * time.Second
	// DefaultMaxKeys bounds the distinct lines tracked; records with a
	// message beyond it share one key.
	DefaultMaxKeys = 1024
)

// SummaryMessage is the message of the summary record.
const SummaryMessage = "log lines suppressed: too many alike"

// Options configures a Handler. The zero value takes the defaults.
type Options struct {
	// Burst is how many records per key pass in one Interval.
	Burst int
	// Interval is the length of a counting period.
	Interval time.Duration
	// MaxKeys bounds the keys tracked at once.
	MaxKeys int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler is a slog.Handler that throttles repeated records. It is safe for
// concurrent use; the handlers WithAttrs and WithGroup return share its
// counts.
type Handler struct {
	inner slog.Handler
	st    *state
}

// state is what the handlers derived from one New share.
type state struct {
	burst    int
	interval time.Duration
	maxKeys  int
	now      func() time.Time

	mu     sync.Mutex
	keys   map[key]*count
	timer  *time.Timer // pending Flush for the suppressed lines of a quiet key
	closed bool        // Close was called: arm no more timers
}

// key identifies alike records.
type key struct {
	level slog.Level
	msg   string
}

// count is one key's tally in its current interval.
type count struct {
	start      time.Time    // the interval's start
	passed     int          // records let through in it
	suppressed int          // records dropped in it
	h          slog.Handler // the handler of the first dropped record
}

// New returns a Handler that writes to inner.
func New(inner slog.Handler, opts Options) *Handler {
	st := &state{burst: opts.Burst, interval: opts.Interval, maxKeys: opts.MaxKeys, now: opts.Now, keys: map[key]*count{}}
	if st.burst <= 0 {
		st.burst = DefaultBurst
	}
	if st.interval <= 0 {
		st.interval = DefaultInterval
	}
	if st.maxKeys <= 0 {
		st.maxKeys = DefaultMaxKeys
	}
	if st.now == nil {
		st.now = time.Now
	}
	return &Handler{inner: inner, st: st}
}

// Enabled reports whether the inner handler handles level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// WithAttrs returns a Handler whose records carry attrs, sharing h's counts.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{inner: h.inner.WithAttrs(attrs), st: h.st}
}

// WithGroup returns a Handler that puts attributes in group name, sharing
// h's counts.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(name), st: h.st}
}

// Handle writes r unless Burst records alike have passed in the current
// interval. The first record of a key in a new interval first writes the
// summary of the previous one, if it dropped any.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	st := h.st
	now := st.now()
	k := key{r.Level, r.Message}
	st.mu.Lock()
	c := st.keys[k]
	if c == nil {
		if len(st.keys) >= st.maxKeys {
			st.sweep(now)
		}
		if len(st.keys) >= st.maxKeys {
			k = key{level: r.Level} // too many distinct lines: share one key
			c = st.keys[k]
		}
		if c == nil {
			c = &count{start: now}
			st.keys[k] = c
		}
	}
	var summary *slog.Record
	var summaryTo slog.Handler
	if now.Sub(c.start) >= st.interval {
		summary, summaryTo = st.summarize(k, c)
		*c = count{start: now}
	}
	pass := c.passed < st.burst
	if pass {
		c.passed++
	} else {
		if c.suppressed == 0 {
			c.h = h.inner
			st.schedule(c.start.Add(st.interval).Sub(now))
		}
		c.suppressed++
	}
	st.mu.Unlock()
	if summary != nil {
		summaryTo.Handle(ctx, *summary)
	}
	if !pass {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

// Flush writes the summaries of the intervals that have ended and forgets
// the keys that have nothing left to say. A timer calls it after a dropped
// record's interval ends, so that a flood that stops is still reported;
// tests with an injected clock call it directly.
func (h *Handler) Flush() {
	st := h.st
	type pending struct {
		r  slog.Record
		to slog.Handler
	}
	var out []pending
	st.mu.Lock()
	now := st.now()
	for k, c := range st.keys {
		if now.Sub(c.start) < st.interval {
			continue
		}
		if r, to := st.summarize(k, c); r != nil {
			out = append(out, pending{*r, to})
		}
		delete(st.keys, k)
	}
	var next time.Duration = -1
	for _, c := range st.keys {
		if c.suppressed > 0 {
			if d := c.start.Add(st.interval).Sub(now); next < 0 || d < next {
				next = d
			}
		}
	}
	st.timer = nil
	if next >= 0 {
		st.schedule(next)
	}
	st.mu.Unlock()
	for _, p := range out {
		p.to.Handle(context.Background(), p.r)
	}
}

// summarize returns the summary record of c's interval, or nil when it
// dropped nothing. st.mu is held.
func (st *state) summarize(k key, c *count) (*slog.Record, slog.Handler) {
	if c.suppressed == 0 {
		return nil, nil
	}
	r := slog.NewRecord(c.start.Add(st.interval), k.level, SummaryMessage, 0)
	r.AddAttrs(
		slog.String("message", k.msg),
		slog.Int("suppressed", c.suppressed),
		slog.Int("passed", c.passed),
		slog.Duration("interval", st.interval),
	)
	return &r, c.h
}

// sweep forgets keys whose interval ended with nothing dropped. st.mu is
// held.
func (st *state) sweep(now time.Time) {
	for k, c := range st.keys {
		if c.suppressed == 0 && now.Sub(c.start) >= st.interval {
			delete(st.keys, k)
		}
	}
}

// Close writes the pending summaries (as Flush would, at the end of their
// intervals) and stops the flush timer.
func (h *Handler) Close() {
	st := h.st
	st.mu.Lock()
	st.closed = true
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	var out []slog.Record
	var to []slog.Handler
	for k, c := range st.keys {
		if r, t := st.summarize(k, c); r != nil {
			out, to = append(out, *r), append(to, t)
		}
		delete(st.keys, k)
	}
	st.mu.Unlock()
	for i := range out {
		to[i].Handle(context.Background(), out[i])
	}
}

// schedule arms the flush timer to fire after d unless one is pending.
// st.mu is held.
func (st *state) schedule(d time.Duration) {
	if st.timer != nil || st.closed {
		return
	}
	st.timer = time.AfterFunc(max(d, 0)+time.Millisecond, func() { (&Handler{st: st}).Flush() })
}
