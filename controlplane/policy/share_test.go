package policy

import (
	"slices"
	"testing"
)

// TestShareThreshold: share_threshold puts the wildcard value in the limit's
// SharedValues at its level, under nested descriptors too, and survives
// Marshal.
func TestShareThreshold(t *testing.T) {
	d := mustParse(t, `
domain: d
descriptors:
  - key: path
    value: "/files/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: "/own/*"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    value: "t*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
`)
	cases := []struct {
		entries []Entry
		shared  []string
	}{
		{[]Entry{{"path", "/files/a"}}, []string{"/files/*"}},
		{[]Entry{{"path", "/own/a"}}, nil},
		{[]Entry{{"tenant", "t1"}, {"user", "u"}}, []string{"t*", ""}},
	}
	for _, c := range cases {
		ls := d.Match(c.entries)
		if len(ls) != 1 || !slices.Equal(ls[0].SharedValues, c.shared) {
			t.Errorf("%v: matched %v, want shared values %q", c.entries, ls, c.shared)
		}
	}
	y, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("back.yaml", y)
	if err != nil || !back.Equal(d) {
		t.Fatalf("Marshal round trip: %v\n%s", err, y)
	}
}
