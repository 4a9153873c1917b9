package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/algorithms"
)

// mustParseFile parses a file from testdata or fails the test.
func mustParseFile(t testing.TB, name string) *Domain {
	t.Helper()
	path := filepath.Join("testdata", name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(path, data)
	if err != nil {
		t.Fatalf("Parse(%s): %v", path, err)
	}
	return d
}

// mustParse parses an inline document or fails the test.
func mustParse(t testing.TB, doc string) *Domain {
	t.Helper()
	d, err := Parse("inline.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, doc)
	}
	return d
}

// limitByID finds a limit by ID.
func limitByID(t testing.TB, d *Domain, id string) *Limit {
	t.Helper()
	for _, l := range d.Limits() {
		if l.ID == id {
			return l
		}
	}
	var ids []string
	for _, l := range d.Limits() {
		ids = append(ids, l.ID)
	}
	t.Fatalf("no limit %q in domain %q; have %q", id, d.Name, ids)
	return nil
}

// want is the expected shape of one limit.
type want struct {
	id        string
	algo      algorithms.Kind
	requests  int64
	window    time.Duration
	unit      algorithms.Unit
	burst     int64
	unlimited bool
	shadow    bool
	fail      FailureMode
	name      string
	replaces  string // comma-separated
	path      string
}

func (w want) check(t *testing.T, d *Domain) {
	t.Helper()
	l := limitByID(t, d, w.id)
	got := want{id: l.ID, algo: l.Algorithm, requests: l.Requests, window: l.Window, unit: l.Unit, burst: l.Burst,
		unlimited: l.Unlimited, shadow: l.ShadowMode, fail: l.FailureMode, name: l.Name,
		replaces: strings.Join(l.Replaces, ","), path: w.path}
	if w.path != "" {
		got.path = l.Path
	}
	if got != w {
		t.Errorf("limit %s:\n got  %+v\n want %+v", w.id, got, w)
	}
	if l.Domain != d.Name {
		t.Errorf("limit %s: Domain = %q, want %q", w.id, l.Domain, d.Name)
	}
}

func TestParseRatelimitFormats(t *testing.T) {
	tests := []struct {
		file   string
		domain string
		limits int
		want   []want
	}{
		{"ratelimit_basic.yaml", "shop", 9, []want{
			{id: "tenant=acme/user#0", algo: algorithms.KindFixedWindow, requests: 5, window: time.Second, unit: algorithms.UnitSecond, fail: FailOpen,
				path: "descriptors[0].descriptors[0].rate_limit"},
			{id: "tenant=acme/user=root#0", algo: algorithms.KindFixedWindow, requests: 50, window: time.Second, unit: algorithms.UnitSecond, fail: FailOpen},
			{id: "client#0", algo: algorithms.KindFixedWindow, requests: 20, window: time.Minute, unit: algorithms.UnitMinute, fail: FailOpen},
			{id: "client=partner#0", algo: algorithms.KindFixedWindow, requests: 300, window: time.Minute, unit: algorithms.UnitMinute, fail: FailOpen},
			{id: "report#0", algo: algorithms.KindFixedWindow, requests: 2, window: time.Hour, unit: algorithms.UnitHour, fail: FailOpen},
			{id: "export#0", algo: algorithms.KindFixedWindow, requests: 1, window: 24 * time.Hour, unit: algorithms.UnitDay, fail: FailOpen},
			{id: "region=eu#0", algo: algorithms.KindFixedWindow, requests: 1000, window: 7 * 24 * time.Hour, unit: algorithms.UnitWeek, fail: FailOpen},
			{id: "region=eu/zone=eu-west#0", algo: algorithms.KindFixedWindow, requests: 40000, window: 30 * 24 * time.Hour, unit: algorithms.UnitMonth, fail: FailOpen},
			{id: "region=eu/zone=eu-north#0", algo: algorithms.KindFixedWindow, requests: 900000, window: 365 * 24 * time.Hour, unit: algorithms.UnitYear, fail: FailOpen},
		}},
		{"ratelimit_wildcard.yaml", "wild", 8, []want{
			{id: "wild=foo*#0", algo: algorithms.KindFixedWindow, requests: 20, window: time.Minute, unit: algorithms.UnitMinute, fail: FailOpen},
			{id: "any=*#0", algo: algorithms.KindFixedWindow, requests: 25, window: time.Minute, unit: algorithms.UnitMinute, fail: FailOpen},
			{id: "path=%2Fapi%2F*/method=POST#0", algo: algorithms.KindFixedWindow, requests: 26, window: time.Second, unit: algorithms.UnitSecond, fail: FailOpen},
		}},
		{"ratelimit_replaces.yaml", "replaces", 4, []want{
			{id: "remote_address#0", algo: algorithms.KindFixedWindow, requests: 10, window: time.Second, unit: algorithms.UnitSecond, fail: FailOpen, name: "per_ip"},
			{id: "api_key=trusted#0", algo: algorithms.KindFixedWindow, requests: 1000, window: time.Second, unit: algorithms.UnitSecond, fail: FailOpen, replaces: "per_ip"},
			{id: "internal#0", unlimited: true, fail: FailOpen, replaces: "per_ip,per_key"},
		}},
		{"ratelimit_shadow_unlimited.yaml", "shadow", 3, []want{
			{id: "key=value/subkey=subvalue#0", algo: algorithms.KindFixedWindow, requests: 300, window: time.Second, unit: algorithms.UnitSecond, shadow: true, fail: FailOpen},
			{id: "ldap#0", unlimited: true, fail: FailOpen},
			{id: "azure#0", algo: algorithms.KindFixedWindow, requests: 100, window: time.Minute, unit: algorithms.UnitMinute, fail: FailOpen},
		}},
		{"extensions.yaml", "ext", 7, []want{
			{id: "user#0", algo: algorithms.KindTokenBucket, requests: 10, window: time.Second, unit: algorithms.UnitSecond, burst: 50, fail: FailOpen, name: "user_burst",
				path: "descriptors[0].rate_limits[0]"},
			{id: "user#1", algo: algorithms.KindSlidingWindow, requests: 10000, window: 24 * time.Hour, unit: algorithms.UnitDay, fail: FailOpen, name: "user_daily"},
			// failure_mode is inherited from the parent descriptor
			{id: "user/path#0", algo: algorithms.KindGCRA, requests: 90, window: 90 * time.Second, unit: algorithms.UnitUnknown, burst: 5, fail: FailOpen},
			// and from the domain
			{id: "login#0", algo: algorithms.KindSlidingLog, requests: 5, window: 15 * time.Minute, unit: algorithms.UnitUnknown, fail: FailClosed},
			{id: "batch#0", algo: algorithms.KindGCRA, requests: 30, window: 5 * time.Minute, unit: algorithms.UnitUnknown, burst: 30, fail: FailClosed},
			{id: "legacy#0", algo: algorithms.KindFixedWindow, requests: 7, window: time.Minute, unit: algorithms.UnitMinute, fail: FailClosed},
			{id: "tiny#0", algo: algorithms.KindTokenBucket, requests: 1, window: 250 * time.Millisecond, burst: 1, fail: FailClosed},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			d := mustParseFile(t, tt.file)
			if d.Name != tt.domain {
				t.Errorf("Name = %q, want %q", d.Name, tt.domain)
			}
			if d.Source != filepath.Join("testdata", tt.file) {
				t.Errorf("Source = %q", d.Source)
			}
			if n := len(d.Limits()); n != tt.limits {
				t.Errorf("%d limits, want %d", n, tt.limits)
			}
			seen := map[string]bool{}
			for _, l := range d.Limits() {
				if seen[l.ID] {
					t.Errorf("ID %q used twice", l.ID)
				}
				seen[l.ID] = true
			}
			for _, w := range tt.want {
				w.check(t, d)
			}
		})
	}
}

func TestParseDomainSettings(t *testing.T) {
	d := mustParseFile(t, "extensions.yaml")
	if d.FailureMode != FailClosed || !d.ResponseHeaders {
		t.Errorf("FailureMode=%q ResponseHeaders=%v, want closed, true", d.FailureMode, d.ResponseHeaders)
	}
	if got := d.Descriptors[0].FailureMode; got != FailOpen {
		t.Errorf("descriptor failure_mode = %q, want open as written", got)
	}
	if got := d.Descriptors[1].FailureMode; got != "" {
		t.Errorf("descriptor without failure_mode = %q, want empty (inherit)", got)
	}
	b := mustParseFile(t, "ratelimit_basic.yaml")
	if b.FailureMode != FailOpen || b.ResponseHeaders {
		t.Errorf("defaults: FailureMode=%q ResponseHeaders=%v, want open, false", b.FailureMode, b.ResponseHeaders)
	}
	s := mustParseFile(t, "ratelimit_shadow_unlimited.yaml")
	sub := s.Descriptors[0].Descriptors[0]
	if !sub.ShadowMode || !sub.DetailedMetric || !sub.Limits[0].DetailedMetric {
		t.Errorf("shadow_mode/detailed_metric not carried: %+v", sub)
	}
	if s.Descriptors[0].ShadowMode {
		t.Error("shadow_mode leaked to the parent")
	}
}

func TestParseScalarForms(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		id   string
		want func(*Limit) bool
	}{
		{"yaml 1.1 booleans", "domain: d\ndescriptors:\n- key: k\n  shadow_mode: yes\n  rate_limit: {unit: second, requests_per_unit: 1}\n",
			"k#0", func(l *Limit) bool { return l.ShadowMode }},
		{"hex and underscores", "domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: second, requests_per_unit: 0x10}\n- key: j\n  rate_limit: {unit: second, requests_per_unit: 1_000}\n",
			"j#0", func(l *Limit) bool { return l.Requests == 1000 }},
		{"integer value is text", "domain: d\ndescriptors:\n- key: port\n  value: 8080\n  rate_limit: {unit: second, requests_per_unit: 3}\n",
			"port=8080#0", func(l *Limit) bool { return l.Requests == 3 }},
		{"microsecond window", "domain: d\ndescriptors:\n- key: k\n  rate_limit: {window: 1500us, requests_per_unit: 1}\n",
			"k#0", func(l *Limit) bool { return l.Window == 1500*time.Microsecond && l.Unit == algorithms.UnitUnknown }},
		{"null value is absent", "domain: d\ndescriptors:\n- key: k\n  value:\n  rate_limit: {unit: second, requests_per_unit: 2}\n",
			"k#0", func(l *Limit) bool { return l.Requests == 2 }},
		{"escaped id", "domain: d\ndescriptors:\n- key: \"a/b\"\n  value: \"x=y#z%\\n\"\n  rate_limit: {unit: second, requests_per_unit: 2}\n",
			"a%2Fb=x%3Dy%23z%25%0A#0", func(l *Limit) bool { return true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse("f.yaml", []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			if l := limitByID(t, d, tt.id); !tt.want(l) {
				t.Errorf("unexpected limit %+v", l)
			}
		})
	}
}

func TestParseAliases(t *testing.T) {
	doc := `
domain: d
descriptors:
  - key: a
    rate_limit: &std
      unit: minute
      requests_per_unit: 9
  - key: b
    rate_limit: *std
`
	d := mustParse(t, doc)
	a, b := limitByID(t, d, "a#0"), limitByID(t, d, "b#0")
	if a == b || a.Requests != 9 || b.Requests != 9 || b.Window != time.Minute {
		t.Errorf("alias not expanded into a separate limit: %+v %+v", a, b)
	}
}

// TestParseAliasBomb checks that nested aliases (each level repeating the
// one below ten times) cannot make parsing explode.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - &a0 {key: k0, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i < 12; i++ {
		b.WriteString("  - &a" + strconv.Itoa(i) + " {key: k" + strconv.Itoa(i) + ", descriptors: [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + strconv.Itoa(i-1))
		}
		b.WriteString("]}\n")
	}
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil {
		t.Fatal("want an error")
	}
	if !strings.Contains(err.Error(), "too many errors") && !strings.Contains(err.Error(), "document too large") {
		t.Errorf("error does not say why it stopped:\n%v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestParseNodeBudget(t *testing.T) {
	defer func(n int64) { maxNodes = n }(maxNodes)
	maxNodes = 40
	data, err := os.ReadFile("testdata/extensions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse("ext.yaml", data)
	if err == nil || !strings.Contains(err.Error(), "document too large: more than 40 YAML nodes") {
		t.Fatalf("got %v", err)
	}
}

// TestUnitMatchesRLS checks that algorithms.Unit converts to the RLS enum by value.
func TestUnitMatchesRLS(t *testing.T) {
	for _, u := range []algorithms.Unit{algorithms.UnitUnknown, algorithms.UnitSecond, algorithms.UnitMinute, algorithms.UnitHour, algorithms.UnitDay, algorithms.UnitWeek, algorithms.UnitMonth, algorithms.UnitYear} {
		if got := rlsv3.RateLimitResponse_RateLimit_Unit(u).String(); got != u.String() {
			t.Errorf("Unit %d: RLS name %s, ours %s", u, got, u)
		}
	}
	if unitLength(algorithms.UnitMonth) != 30*24*time.Hour || unitLength(algorithms.UnitYear) != 365*24*time.Hour || unitLength(algorithms.UnitUnknown) != 0 {
		t.Error("unit lengths differ from envoyproxy/ratelimit's")
	}
}

func TestErrorListUnwrap(t *testing.T) {
	_, err := Parse("x.yaml", []byte("domain: ''\n"))
	var one *Error
	if !errors.As(err, &one) {
		t.Fatalf("errors.As(*Error) failed on %T", err)
	}
	if one.Line != 1 || one.Field != "domain" || one.File != "x.yaml" {
		t.Errorf("got %+v", one)
	}
}
