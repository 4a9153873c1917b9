package config

import (
	"errors"
	"strings"
	"testing"
)

func TestParseJSONValues(t *testing.T) {
	v, err := parseJSON([]byte(` {"a": [1, -2.5e3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"], "b": {}} `))
	if err != nil {
		t.Fatal(err)
	}
	if v.kind != kindObject || len(v.members) != 2 || v.members[0].name != "a" {
		t.Fatalf("bad object: %+v", v)
	}
	items := v.members[0].value.items
	if len(items) != 6 {
		t.Fatalf("got %d items", len(items))
	}
	if items[0].text != "1" || items[1].text != "-2.5e3" || !items[2].boolean || items[3].boolean || items[4].kind != kindNull {
		t.Fatalf("bad scalars: %+v", items)
	}
	if got, want := items[5].text, "x\"\\/\b\f\n\r\té😀"; got != want {
		t.Fatalf("string: got %q want %q", got, want)
	}
}

func TestParseJSONErrors(t *testing.T) {
	tests := []struct{ doc, problem string }{
		{``, "unexpected end"},
		{`{`, "expected a quoted member name"},
		{`{"a" 1}`, "expected ':'"},
		{`{"a":1,}`, "expected a quoted member name"},
		{`{"a":1 "b":2}`, "expected ',' or '}'"},
		{`[1 2]`, "expected ',' or ']'"},
		{`[1,]`, "unexpected character"},
		{`{"a":1,"a":2}`, "duplicate member"},
		{`01`, "unexpected data after"},
		{`1.`, "no digits after '.'"},
		{`1e`, "no digits in exponent"},
		{`-`, "invalid number"},
		{`tru`, "expected true"},
		{`"abc`, "unterminated string"},
		{`"a` + "\n" + `"`, "control character"},
		{`"\x"`, "invalid escape"},
		{`"\u12"`, "truncated"},
		{`"\u12zz"`, "invalid hex digit"},
		{`"\ud800"`, "unpaired surrogate"},
		{`"\udc00"`, "unpaired surrogate"},
		{"\"\xff\"", "not valid UTF-8"},
		{`{} {}`, "unexpected data after"},
		{strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2), "nested too deeply"},
	}
	for _, tt := range tests {
		_, err := parseJSON([]byte(tt.doc))
		var se *SyntaxError
		if !errors.As(err, &se) || !strings.Contains(se.Problem, tt.problem) {
			t.Errorf("%q: got %v, want problem containing %q", tt.doc, err, tt.problem)
		}
	}
}

// FuzzParse checks that no input makes the parser panic and that accepted
// configurations satisfy the documented bounds.
func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte(`{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}]}`))
	f.Add([]byte(`[{"a":"\ud83d\ude00"}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if s := c.Settle; s.BatchMax < 1 || s.BatchMax > MaxSettleBatchMax || s.QueueMax < 1 || s.IntervalMs < 0 || s.TimeoutMs < 1 {
			t.Fatalf("accepted invalid settle options: %+v", s)
		}
		if c.Cluster == "" || c.Domain == "" || len(c.RateLimits) == 0 || len(c.RateLimits) > MaxRateLimits {
			t.Fatalf("accepted an invalid configuration: %+v", c)
		}
		for _, rl := range c.RateLimits {
			if (rl.HitsAddend == 0 && rl.Usage == nil) || len(rl.Actions) == 0 ||
				(rl.Usage != nil && (rl.Usage.Source == 0 || rl.HitsAddend != rl.Usage.Reserve)) {
				t.Fatalf("accepted an invalid rate limit: %+v", rl)
			}
		}
	})
}
