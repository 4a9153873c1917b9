package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMarshalRoundTrip(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	files = append(files, "example.yaml")
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Parse(f, data)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse("marshaled", out)
			if err != nil {
				t.Fatalf("re-parse: %v\n%s", err, out)
			}
			if !d.Equal(back) {
				t.Errorf("round trip changed the policy:\n%s", out)
			}
			again, err := Marshal(back)
			if err != nil || string(again) != string(out) {
				t.Errorf("Marshal is not canonical:\n%s\nthen\n%s", out, again)
			}
		})
	}
}

func TestMarshalCanonical(t *testing.T) {
	d := mustParse(t, `
domain: "yes"
failure_mode: CLOSED
response_headers: on
descriptors:
  - key: "true"
    value: "007"
    value_to_metric: true
    rate_limits:
      - {algorithm: token_bucket, window: 60s, requests_per_unit: 5}
      - {algorithm: Sliding_Window, window: 90s, requests_per_unit: 5, name: "a: b"}
      - {algorithm: gcra, window: 1500us, requests_per_unit: 1, burst: 3}
  - key: "multi\nline"
    value: "tab\there"
    failure_mode: open
    rate_limit: {unlimited: true, replaces: [{name: "a: b"}]}
`)
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := `domain: "yes"
failure_mode: closed
response_headers: true
descriptors:
  - key: "true"
    value: "007"
    value_to_metric: true
    rate_limits:
      - algorithm: token_bucket
        unit: minute
        requests_per_unit: 5
      - name: 'a: b'
        algorithm: sliding_window
        window: 1m30s
        requests_per_unit: 5
      - algorithm: gcra
        window: 1500us
        requests_per_unit: 1
        burst: 3
  - key: |-
      multi
      line
    value: "tab\there"
    failure_mode: open
    rate_limit:
      unlimited: true
      replaces:
        - name: 'a: b'
`
	if string(out) != want {
		t.Errorf("Marshal:\n%s\nwant\n%s", out, want)
	}
	back, err := Parse("m", out)
	if err != nil || !d.Equal(back) {
		t.Fatalf("round trip: %v", err)
	}
}

// TestMarshalPlainRatelimit checks that a file without extensions comes back
// in envoyproxy/ratelimit's own vocabulary.
func TestMarshalPlainRatelimit(t *testing.T) {
	d := mustParseFile(t, "ratelimit_basic.yaml")
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{"algorithm", "window", "burst", "rate_limits", "failure_mode", "response_headers"} {
		if strings.Contains(string(out), ext+":") {
			t.Errorf("output uses %s:\n%s", ext, out)
		}
	}
}

func TestEqual(t *testing.T) {
	base := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	a := mustParse(t, base)
	if !a.Equal(mustParse(t, base)) {
		t.Error("equal documents differ")
	}
	for _, other := range []string{
		"domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 6}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log}\n",
		"domain: d\nfailure_mode: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"domain: d\n",
	} {
		if a.Equal(mustParse(t, other)) {
			t.Errorf("different documents equal:\n%s", other)
		}
	}
	var nilD *Domain
	if nilD.Equal(a) || !nilD.Equal(nil) {
		t.Error("nil comparisons")
	}
}

func TestFormatDuration(t *testing.T) {
	for _, d := range []time.Duration{time.Microsecond, 1500 * time.Microsecond, 250 * time.Millisecond,
		time.Second + 500*time.Microsecond, 90 * time.Minute, 10 * time.Second} {
		s := formatDuration(d)
		back, err := time.ParseDuration(s)
		if err != nil || back != d || strings.ContainsRune(s, 'µ') {
			t.Errorf("%v -> %q -> %v, %v", d, s, back, err)
		}
	}
}
