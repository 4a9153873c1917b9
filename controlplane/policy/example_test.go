package policy

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
)

// mustParseExample parses example.yaml, the policies `make run` serves.
func mustParseExample(t testing.TB) *Domain {
	t.Helper()
	data, err := os.ReadFile("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse("example.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestExamplePolicy(t *testing.T) {
	d := mustParseExample(t)
	if d.Name != "sluice-demo" || !d.ResponseHeaders || d.FailureMode != FailOpen {
		t.Fatalf("domain %q response_headers=%v failure_mode=%q", d.Name, d.ResponseHeaders, d.FailureMode)
	}
	tests := []struct {
		request []Entry
		want    []want
	}{
		{entries("remote_address=10.0.0.1"), []want{{id: "remote_address#0", algo: algorithms.KindFixedWindow, requests: 10,
			window: 10 * time.Second, unit: algorithms.UnitUnknown, fail: FailOpen, name: "per_address"}}},
		{entries("api_key=k-123"), []want{{id: "api_key#0", algo: algorithms.KindTokenBucket, requests: 5, window: time.Second,
			unit: algorithms.UnitSecond, burst: 20, fail: FailOpen}}},
		{entries("path=/login"), []want{
			{id: "path=%2Flogin*#0", algo: algorithms.KindSlidingLog, requests: 5, window: time.Minute, unit: algorithms.UnitMinute, fail: FailClosed},
			{id: "path=%2Flogin*#1", algo: algorithms.KindSlidingLog, requests: 30, window: time.Hour, unit: algorithms.UnitHour, fail: FailClosed}}},
		{entries("path=/healthz"), []want{{id: "path=%2Fhealthz#0", unlimited: true, fail: FailOpen}}},
		{entries("path=/orders/7"), []want{{id: "path#0", algo: algorithms.KindSlidingLog, requests: 100, window: time.Minute,
			unit: algorithms.UnitMinute, shadow: true, fail: FailOpen}}},
		{entries("method=GET"), nil},
	}
	for _, tt := range tests {
		got := d.Match(tt.request)
		if len(got) != len(tt.want) {
			t.Errorf("Match(%v) = %q, want %d limits", tt.request, ids(got), len(tt.want))
			continue
		}
		for i, w := range tt.want {
			if got[i].ID != w.id {
				t.Errorf("Match(%v)[%d] = %s, want %s", tt.request, i, got[i].ID, w.id)
			}
			w.check(t, d)
		}
	}
}

func TestExampleEmbedded(t *testing.T) {
	s := Example()
	if s.Len() != 1 || s.Domain("sluice-demo") == nil {
		t.Fatalf("Example() = %v domains, want sluice-demo", s.Len())
	}
	if !s.Domain("sluice-demo").Equal(mustParseExample(t)) {
		t.Fatal("the embedded example differs from example.yaml")
	}
}
