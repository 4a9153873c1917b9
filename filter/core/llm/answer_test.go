package llm

import (
	"strings"
	"testing"
)

// readJSON reads a JSON answer in the given chunks.
func readJSON(chunks [][]byte) Result {
	r := NewJSONReader()
	for _, c := range chunks {
		r.Write(c)
	}
	return r.Result()
}

func TestJSONReaderFixtures(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Result
	}{
		// prompt_tokens 31 of which 16 cached.
		{"chat.json", Result{Usage: Usage{Input: 15, Cached: 16, Output: 7}, Status: UsageComplete}},
		// input_tokens 120 of which 100 cached.
		{"responses.json", Result{Usage: Usage{Input: 20, Cached: 100, Output: 45}, Status: UsageComplete}},
		// input_tokens apart from the cache's reads and writes.
		{"anthropic.json", Result{Usage: Usage{Input: 12, Cached: 1800, CacheWrite: 200, Output: 9}, Status: UsageComplete}},
		{"anthropic-error.json", Result{Status: UsageMissing, Stats: Stats{Errors: 1}}},
	} {
		body := fixture(t, "answer/"+tc.file)
		tc.want.Stats.Bytes = int64(len(body))
		for _, c := range chunkings(body) {
			if got := readJSON(c.chunks); got != tc.want {
				t.Fatalf("%s, %s:\n got %+v\nwant %+v", tc.file, c.name, got, tc.want)
			}
		}
	}
}

func TestJSONReaderUsageAnywhere(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for _, body := range []string{
		`{"usage":{"output_tokens":3,"input_tokens":2},"content":[{"type":"text","text":"` + long + `"}]}`,
		`{"content":[{"type":"text","text":"` + long + `"}],"usage":{"input_tokens":2,"output_tokens":3}}`,
		`{"choices":[{"message":{"content":"` + long + `"}}],"usage":{"prompt_tokens":2,"completion_tokens":3,"prompt_tokens_details":null}}`,
	} {
		got := readJSON([][]byte{[]byte(body)})
		if got.Usage != (Usage{Input: 2, Output: 3}) || got.Status != UsageComplete {
			t.Errorf("%.40s...: %+v", body, got)
		}
	}
}

func TestJSONReaderOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		status    UsageStatus
		malformed int64
	}{
		{"no usage", `{"id":"x","choices":[]}`, UsageMissing, 0},
		{"usage null", `{"usage":null}`, UsageMissing, 0},
		{"usage empty", `{"usage":{}}`, UsageMissing, 0},
		{"usage not an object", `{"usage":12}`, UsageMissing, 0},
		{"output only", `{"usage":{"output_tokens":5}}`, UsagePartial, 0},
		{"negative", `{"usage":{"input_tokens":1,"output_tokens":-1}}`, UsageMalformed, 0},
		{"fraction", `{"usage":{"input_tokens":1.5,"output_tokens":1}}`, UsageMalformed, 0},
		{"string", `{"usage":{"input_tokens":"1","output_tokens":1}}`, UsageMalformed, 0},
		{"huge", `{"usage":{"input_tokens":1,"output_tokens":1e400}}`, UsageMalformed, 0},
		{"above 2^53", `{"usage":{"input_tokens":1,"output_tokens":9007199254740992}}`, UsageMalformed, 0},
		{"cached bad", `{"usage":{"input_tokens":1,"output_tokens":1,"input_tokens_details":{"cached_tokens":true}}}`, UsageMalformed, 0},
		{"truncated after usage", `{"usage":{"input_tokens":1,"output_tokens":2},"id":"x`, UsageMissing, 1},
		{"not JSON", `<html>502 Bad Gateway</html>`, UsageMissing, 1},
		{"empty", ``, UsageMissing, 1},
		{"an SSE body", "data: {\"usage\":{}}\n\n", UsageMissing, 1},
	} {
		got := readJSON([][]byte{[]byte(tc.body)})
		if got.Status != tc.status || got.Stats.Malformed != tc.malformed {
			t.Errorf("%s: %v, %d malformed; want %v, %d", tc.name, got.Status, got.Stats.Malformed, tc.status, tc.malformed)
		}
	}
}

// TestCachedMoreThanInput: a provider's inconsistent counts do not make
// a negative input.
func TestCachedMoreThanInput(t *testing.T) {
	got := readJSON([][]byte{[]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}`)})
	if got.Usage != (Usage{Input: 0, Cached: 9, Output: 1}) {
		t.Errorf("Usage = %+v", got.Usage)
	}
}

func TestJSONReaderAllocatesNothing(t *testing.T) {
	body := fixture(t, "answer/chat.json")
	r := NewJSONReader()
	if n := testing.AllocsPerRun(100, func() {
		r.Reset()
		r.Write(body[:100])
		r.Write(body[100:])
		_ = r.Result()
	}); n != 0 {
		t.Errorf("an answer allocates %v times", n)
	}
}

func TestUsageTotal(t *testing.T) {
	if got := (Usage{Input: 1, Cached: 2, CacheWrite: 3, Output: 4}).Total(); got != 10 {
		t.Errorf("Total = %d", got)
	}
	if got := (Usage{Input: MaxTokens, Output: 1}).Total(); got != MaxTokens {
		t.Errorf("Total = %d, want it saturated", got)
	}
}
