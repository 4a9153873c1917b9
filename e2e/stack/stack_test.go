package stack

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP sluice_rls_decisions_total ShouldRateLimit requests answered.
# TYPE sluice_rls_decisions_total counter
sluice_rls_decisions_total{code="OK",domain="e2e"} 11
sluice_rls_decisions_total{code="OVER_LIMIT",domain="e2e"} 2
sluice_rls_decisions_total{code="OK",domain="other"} 5
sluice_store_degraded 1
weird{a="x\"y\\z",b="line\nbreak"} 1.5e3 1700000000000
`
	s, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		match []string
		want  float64
	}{
		{"sluice_rls_decisions_total", nil, 18},
		{"sluice_rls_decisions_total", []string{"domain", "e2e"}, 13},
		{"sluice_rls_decisions_total", []string{"domain", "e2e", "code", "OK"}, 11},
		{"sluice_rls_decisions_total", []string{"domain", "none"}, 0},
		{"sluice_store_degraded", nil, 1},
		{"weird", []string{"a", `x"y\z`, "b", "line\nbreak"}, 1500},
		{"absent", nil, 0},
	} {
		if got := s.Sum(tc.name, tc.match...); got != tc.want {
			t.Errorf("Sum(%s, %q) = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
}

func TestParseMetricsErrors(t *testing.T) {
	for _, text := range []string{
		"novalue\n",
		"name{a=\"x\"}\n",
		"name{a=x} 1\n",
		"name{a=\"unterminated} 1\n",
		"name notanumber\n",
	} {
		if _, err := ParseMetrics(strings.NewReader(text)); err == nil {
			t.Errorf("ParseMetrics(%q): no error", text)
		}
	}
}
