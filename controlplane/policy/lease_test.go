package policy

import (
	"strings"
	"testing"
)

func TestParseLease(t *testing.T) {
	for _, tt := range []struct {
		setting string
		want    bool
	}{
		{"", false},
		{"lease: off", false},
		{"lease: auto", true},
		{"lease: AUTO", true},
	} {
		d := mustParse(t, "domain: d\n"+tt.setting+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
		if d.Lease != tt.want || d.Limits()[0].Lease != tt.want {
			t.Errorf("%q: domain %v, limit %v, want %v", tt.setting, d.Lease, d.Limits()[0].Lease, tt.want)
		}
		out, err := Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(out), "lease: auto"); got != tt.want {
			t.Errorf("%q: Marshal wrote lease %v:\n%s", tt.setting, got, out)
		}
		back, err := Parse("m", out)
		if err != nil || !back.Equal(d) {
			t.Errorf("%q: round trip: %v\n%s", tt.setting, err, out)
		}
	}
	off := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	on := mustParse(t, "domain: d\nlease: auto\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	if off.Equal(on) {
		t.Error("a domain with lease: auto is Equal to one without")
	}
}

func TestParseLeaseBad(t *testing.T) {
	for _, doc := range []string{
		"domain: d\nlease: sometimes\n",
		"domain: d\nlease: [auto]\n",
		"domain: d\ndescriptors:\n  - key: k\n    lease: auto\n",
	} {
		if _, err := Parse("bad.yaml", []byte(doc)); err == nil {
			t.Errorf("accepted %q", doc)
		} else if !strings.Contains(err.Error(), "lease") {
			t.Errorf("%q: error does not name lease: %v", doc, err)
		}
	}
}
