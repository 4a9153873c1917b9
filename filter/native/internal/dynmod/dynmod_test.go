package dynmod

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// The arena lays headers out in C memory where Envoy reads them back
// unchanged, empty names and values included, and grows for larger sets.
func TestArenaHeaders(t *testing.T) {
	var a cArena
	defer a.free()
	for _, hs := range [][]Header{
		{{":method", "POST"}, {":path", "/x"}, {"host", "rls"}},
		{{"empty", ""}, {"", "no-name"}},
		{{"big", strings.Repeat("v", 5000)}, {"after", "big"}},
		{{"small", "again"}},
	} {
		p, n := a.headers(hs)
		if got := readHeaders(p, n); !slices.Equal(got, hs) {
			t.Errorf("arena gave back %q, want %q", got, hs)
		}
	}
	if p, n := a.headers(nil); p != nil || n != 0 {
		t.Errorf("no headers: %p %d, want nil 0", p, n)
	}
}

// appendChunks copies chunks up to a limit and reports whether all fit.
func TestAppendChunks(t *testing.T) {
	for _, tt := range []struct {
		chunks []string
		limit  int
		want   string
		whole  bool
	}{
		{nil, 10, "", true},
		{[]string{"ab", "cd"}, 10, "abcd", true},
		{[]string{"ab", "cd"}, 4, "abcd", true},
		{[]string{"ab", "cd"}, 3, "abc", false},
		{[]string{"ab", "cd"}, 0, "", false},
		{[]string{"", "x"}, 1, "x", true},
	} {
		got, whole := appendChunks([]byte(">"), bufsOf(tt.chunks...), tt.limit)
		if string(got) != ">"+tt.want || whole != tt.whole {
			t.Errorf("appendChunks(%q, %d) = %q %v, want %q %v", tt.chunks, tt.limit, got, whole, ">"+tt.want, tt.whole)
		}
	}
}

// A callout timeout is whole milliseconds, at least 1: Envoy reads 0 as
// none.
func TestTimeoutMs(t *testing.T) {
	for d, want := range map[time.Duration]uint64{0: 1, time.Microsecond: 1, 25 * time.Millisecond: 25, 1500 * time.Microsecond: 1, 2 * time.Second: 2000} {
		if got := uint64(timeoutMs(d)); got != want {
			t.Errorf("timeoutMs(%v) = %d, want %d", d, got, want)
		}
	}
}

// The init results of a callout are errors that say why; success is none.
func TestCalloutErrors(t *testing.T) {
	if calloutErr(0) != nil {
		t.Error("success is an error")
	}
	var ce CalloutError
	if err := calloutErr(2); !errors.As(err, &ce) || ce != ErrClusterNotFound || !strings.Contains(err.Error(), "cluster not found") {
		t.Errorf("init result 2: %v", err)
	}
	if s := CalloutError(9).Error(); !strings.Contains(s, "9") {
		t.Errorf("unknown init result: %q", s)
	}
	if CalloutReset.String() != "reset" || CalloutResult(7).String() != "result 7" {
		t.Errorf("results: %s %s", CalloutReset, CalloutResult(7))
	}
}

// Outside Envoy (no callbacks resolved) logging does nothing, and metrics
// cannot be defined once the Factory returned.
func TestOutsideEnvoy(t *testing.T) {
	Log(LogError, "not in Envoy")
	if LogEnabled(LogCritical) || Concurrency() != 0 {
		t.Error("the binding reports Envoy where there is none")
	}
	var c Config
	if _, err := c.DefineCounter("x"); !errors.Is(err, ErrMetricsFrozen) {
		t.Errorf("DefineCounter outside the Factory: %v", err)
	}
	Counter{}.Add(1) // the zero Counter does nothing
	Gauge{}.Set(1)
}
