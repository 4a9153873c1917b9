package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

func TestReserveParse(t *testing.T) {
	d, err := Load("testdata/reserve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ls := d.Domain("shaping").Limits()
	want := []struct {
		burst   int64
		maxWait time.Duration
		params  algorithms.Reserve // in milliseconds
	}{
		{5, 5 * time.Second, algorithms.Reserve{Rate: 10, Period: 1000, Burst: 5, MaxWait: 5000}},
		{3, 250 * time.Microsecond, algorithms.Reserve{Rate: 3, Period: 1500, Burst: 3, MaxWait: 0}},
		{100, 0, algorithms.Reserve{Rate: 100, Period: 60000, Burst: 100, MaxWait: 0}},
	}
	if len(ls) != len(want) {
		t.Fatalf("got %d limits", len(ls))
	}
	for i, w := range want {
		l := ls[i]
		if l.Algorithm != algorithms.KindReserve || l.Burst != w.burst || l.MaxWait != w.maxWait {
			t.Errorf("limit %d: %+v", i, l)
		}
		if got := l.Params(time.Millisecond); got != w.params {
			t.Errorf("limit %d: params %+v, want %+v", i, got, w.params)
		}
		if got := l.ReserveParams(time.Microsecond).MaxWait; got != int64(w.maxWait/time.Microsecond) {
			t.Errorf("limit %d: max wait %d µs", i, got)
		}
	}
}

func TestReserveErrors(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"max_wait missing", "      {algorithm: reserve, unit: second, requests_per_unit: 10}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: required with algorithm reserve: the longest a request may wait (e.g. 500ms; 0s never waits)`},
		{"max_wait on token_bucket", "      algorithm: token_bucket\n      unit: second\n      requests_per_unit: 10\n      max_wait: 1s\n",
			`v.yaml:8: domain "api": descriptors[0].rate_limit.max_wait: only reserve takes a max_wait (algorithm is token_bucket)`},
		{"max_wait on the default algorithm", "      {unit: second, requests_per_unit: 10, max_wait: 1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: only reserve takes a max_wait (algorithm is fixed_window)`},
		{"max_wait without unit", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: 500}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must be a duration with a unit, e.g. 500ms or 2s (got 500)`},
		{"max_wait not a duration", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: soon}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: not a duration: "soon" (use ns, us, ms, s, m or h, e.g. 500ms, 2s)`},
		{"max_wait negative", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: -1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must be >= 0 (got -1s)`},
		{"max_wait too long", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: 2h}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must be at most 1h0m0s: the filter holds waiting requests in Envoy (got 2h)`},
		{"max_wait below a microsecond", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: 1500ns}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must be a whole number of microseconds, the resolution of the Redis clock (got 1500ns)`},
		{"max_wait a list", "      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: [1s]}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must be a string, got a list`},
		{"max_wait with unlimited", "      {unlimited: true, max_wait: 1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.max_wait: must not be set when unlimited is true`},
		{"burst 0", "      {algorithm: reserve, unit: second, requests_per_unit: 10, burst: 0, max_wait: 1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.burst: must be >= 1 (got 0)`},
		{"burst x window overflows", "      {algorithm: reserve, unit: year, requests_per_unit: 10, burst: 1000000000, max_wait: 1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.burst: reserve: burst x window must be at most 640511h56m49.213693952s (2^61 ns) so the bucket arithmetic stays exact (got 1000000000 x 8760h0m0s); lower burst or window`},
		{"block is fixed_window only", "      {algorithm: reserve, unit: second, requests_per_unit: 0, max_wait: 1s}\n",
			`v.yaml:5: domain "api": descriptors[0].rate_limit.requests_per_unit: 0 (refuse every request, as envoyproxy/ratelimit reads it) is only accepted with fixed_window (algorithm is reserve)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("v.yaml", []byte(limitDoc(tt.body)))
			var list ErrorList
			if !errors.As(err, &list) || len(list) != 1 || list[0].Error() != tt.want {
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
		})
	}
}

// TestReserveMarshal checks that max_wait and a burst other than the rate
// survive Marshal, and that a default burst is left out.
func TestReserveMarshal(t *testing.T) {
	doc := limitDoc("      {algorithm: reserve, unit: second, requests_per_unit: 10, max_wait: 1500us}\n")
	d, err := Parse("v.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := "domain: api\ndescriptors:\n  - key: k\n    rate_limit:\n      algorithm: reserve\n      unit: second\n      requests_per_unit: 10\n      max_wait: 1500us\n"
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	back, err := Parse("m.yaml", out)
	if err != nil || !d.Equal(back) {
		t.Errorf("round trip: %v", err)
	}
	other := *back.Limits()[0]
	other.MaxWait++
	if limitEqual(back.Limits()[0], &other) {
		t.Error("Equal ignores MaxWait")
	}
}
