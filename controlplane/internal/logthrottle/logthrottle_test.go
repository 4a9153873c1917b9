package logthrottle

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// setup returns a throttled logger writing JSON lines to a buffer.
func setup(t *testing.T, opts Options) (*slog.Logger, *Handler, *fakeClock, *syncBuffer) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	opts.Now = clk.Now
	var buf syncBuffer
	h := New(slog.NewJSONHandler(&buf, nil), opts)
	t.Cleanup(h.Close)
	return slog.New(h), h, clk, &buf
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines decodes the JSON lines written so far and resets the buffer.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("bad JSON line %q: %v", l, err)
		}
		out = append(out, m)
	}
	s.b.Reset()
	return out
}

// TestFloodOfOneLine is the wrong-token flood: 20,000 alike warnings in one
// interval write Burst lines, then one summary once the interval ends.
func TestFloodOfOneLine(t *testing.T) {
	log, h, clk, buf := setup(t, Options{Burst: 10, Interval: 10 * time.Second})
	for i := range 20000 {
		log.Warn("policy service: refused a call", "peer", i)
	}
	got := buf.lines(t)
	if len(got) != 10 {
		t.Fatalf("%d lines in the interval, want 10", len(got))
	}
	h.Flush() // the interval has not ended: nothing to say yet
	if got := buf.lines(t); len(got) != 0 {
		t.Fatalf("Flush before the interval ended wrote %v", got)
	}
	clk.Add(10 * time.Second)
	h.Flush()
	got = buf.lines(t)
	if len(got) != 1 {
		t.Fatalf("after the interval: %d lines, want 1 summary: %v", len(got), got)
	}
	s := got[0]
	if s["msg"] != SummaryMessage || s["level"] != "WARN" || s["message"] != "policy service: refused a call" ||
		s["suppressed"] != float64(19990) || s["passed"] != float64(10) {
		t.Errorf("summary = %v", s)
	}
	// A quiet key is forgotten: the next interval starts afresh.
	log.Warn("policy service: refused a call")
	if got := buf.lines(t); len(got) != 1 || got[0]["msg"] != "policy service: refused a call" {
		t.Errorf("after the summary: %v", got)
	}
}

// TestRolloverWritesSummary: the first record of a new interval writes the
// previous interval's summary before itself.
func TestRolloverWritesSummary(t *testing.T) {
	log, _, clk, buf := setup(t, Options{Burst: 2, Interval: time.Second})
	for range 5 {
		log.Error("store failed")
	}
	clk.Add(1500 * time.Millisecond)
	log.Error("store failed")
	got := buf.lines(t)
	var msgs []string
	for _, l := range got {
		msgs = append(msgs, l["msg"].(string))
	}
	want := []string{"store failed", "store failed", SummaryMessage, "store failed"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("lines = %q, want %q", msgs, want)
	}
	if got[2]["suppressed"] != float64(3) {
		t.Errorf("summary = %v", got[2])
	}
}

// TestKeys: level and message make the key; attributes, WithAttrs and
// WithGroup do not split it; MaxKeys bounds what is tracked.
func TestKeys(t *testing.T) {
	tests := []struct {
		name string
		log  func(l *slog.Logger)
		want int // lines written
	}{
		{"distinct messages pass", func(l *slog.Logger) {
			for i := range 3 {
				l.Info("line " + string(rune('a'+i)))
			}
		}, 3},
		{"levels are separate", func(l *slog.Logger) {
			for range 3 {
				l.Info("x")
				l.Warn("x")
			}
		}, 2},
		{"attributes do not split", func(l *slog.Logger) {
			for i := range 3 {
				l.Info("x", "i", i)
			}
		}, 1},
		{"derived loggers share counts", func(l *slog.Logger) {
			l.With("a", 1).Info("x")
			l.WithGroup("g").Info("x")
			l.Info("x")
		}, 1},
		{"beyond MaxKeys, new messages share one key", func(l *slog.Logger) {
			for i := range 10 {
				l.Info(strings.Repeat("m", i+1))
			}
		}, 4}, // 3 keys of their own, then the shared key's 1
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, _, _, buf := setup(t, Options{Burst: 1, Interval: time.Minute, MaxKeys: 3})
			tc.log(log)
			if got := buf.lines(t); len(got) != tc.want {
				t.Errorf("%d lines, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

// TestCloseWritesPending: Close reports what was dropped.
func TestCloseWritesPending(t *testing.T) {
	log, h, _, buf := setup(t, Options{Burst: 1, Interval: time.Hour})
	log.Info("x")
	log.Info("x")
	h.Close()
	got := buf.lines(t)
	if len(got) != 2 || got[1]["msg"] != SummaryMessage || got[1]["suppressed"] != float64(1) {
		t.Errorf("lines = %v", got)
	}
}

// TestLevelFilter: records the inner handler does not want are neither
// written nor counted.
func TestLevelFilter(t *testing.T) {
	var buf syncBuffer
	h := New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}), Options{Burst: 1})
	defer h.Close()
	log := slog.New(h)
	log.Info("x")
	log.Warn("y")
	if got := buf.lines(t); len(got) != 1 || got[0]["msg"] != "y" {
		t.Errorf("lines = %v", got)
	}
}
