package llm

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"
)

// readSSE reads a stream in the given chunks and returns the result and
// the running count after each chunk.
func readSSE(o StreamOptions, chunks [][]byte) (Result, []int64) {
	r := NewSSEReader(o)
	counts := make([]int64, len(chunks))
	for i, c := range chunks {
		r.Write(c)
		counts[i] = r.OutputTokens()
	}
	return r.Result(), counts
}

type sseCase struct {
	file   string
	want   Result
	output int64 // the running count at the end
}

var sseFixtures = []sseCase{
	// The final chunk (stream_options.include_usage) says 7; the deltas
	// before it (21 bytes) were estimated at 6.
	{"chat-usage.sse", Result{Usage: Usage{Input: 31, Output: 7}, Status: UsageComplete, Stats: Stats{Events: 7, Done: true}}, 7},
	// No usage asked: only the estimate of the arguments' 18 bytes.
	{"chat-tools.sse", Result{Status: UsageMissing, Stats: Stats{Events: 5, Done: true}}, 5},
	{"responses.sse", Result{Usage: Usage{Input: 18, Output: 4}, Status: UsageComplete, Stats: Stats{Events: 10}}, 4},
	// message_start's usage, then message_delta's cumulative 41.
	{"anthropic.sse", Result{Usage: Usage{Input: 25, Cached: 1024, Output: 41}, Status: UsageComplete, Stats: Stats{Events: 12}}, 41},
	// Cut before message_delta: input known, output from message_start
	// (1) plus the estimate of "Cold and dark." (14 bytes: 4).
	{"anthropic-cut.sse", Result{Usage: Usage{Input: 25, Cached: 1024, Output: 1}, Status: UsagePartial, Stats: Stats{Events: 5}}, 5},
	{"anthropic-error.sse", Result{Usage: Usage{Input: 25, Cached: 1024, Output: 1}, Status: UsagePartial, Stats: Stats{Events: 5, Errors: 1}}, 2},
}

func TestSSEReaderFixtures(t *testing.T) {
	for _, tc := range sseFixtures {
		for _, end := range []string{"\n", "\r\n", "\r"} {
			body := withLineEnds(fixture(t, "stream/"+tc.file), end)
			want := tc.want
			want.Stats.Bytes = int64(len(body))
			for _, c := range chunkings(body) {
				got, counts := readSSE(StreamOptions{}, c.chunks)
				if got != want {
					t.Fatalf("%s, line end %q, %s:\n got %+v\nwant %+v", tc.file, end, c.name, got, want)
				}
				if last := counts[len(counts)-1]; last != tc.output {
					t.Fatalf("%s, line end %q, %s: OutputTokens = %d, want %d", tc.file, end, c.name, last, tc.output)
				}
				for i := 1; i < len(counts); i++ {
					if counts[i] < counts[i-1] {
						t.Fatalf("%s, %s: the running count fell from %d to %d", tc.file, c.name, counts[i-1], counts[i])
					}
				}
			}
		}
	}
}

// TestRunningCount follows the count event by event on Anthropic's
// stream: the provider's count where it gives one, else the estimate.
func TestRunningCount(t *testing.T) {
	events := bytes.SplitAfter(fixture(t, "stream/anthropic.sse"), []byte("\n\n"))
	want := []int64{
		1,    // message_start: output_tokens 1
		1, 1, // content_block_start, ping
		2,    // "Cold": 1 + ceil(4/4)
		5,    // " and dark.": 1 + ceil(14/4)
		5, 5, // content_block_stop, content_block_start
		8,          // partial_json {"city": "Os (12 bytes): 1 + ceil(26/4)
		9,          // lo"} (4 bytes): 1 + ceil(30/4)
		9,          // content_block_stop
		41, 41, 41, // message_delta: 41; message_stop; the empty tail
	}
	r := NewSSEReader(StreamOptions{})
	for i, ev := range events {
		r.Write(ev)
		if got := r.OutputTokens(); got != want[i] {
			t.Errorf("after event %d: OutputTokens = %d, want %d", i, got, want[i])
		}
	}
}

func TestRunningCountNeverFalls(t *testing.T) {
	// 40 bytes of text (10 tokens), then a provider count of 3: the count
	// stays at 10 (those tokens were drawn), and grows from 3 + estimate.
	s := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("a", 40) + "\"}}]}\n\n" +
		"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("b", 40) + "\"}}]}\n\n"
	parts := strings.SplitAfter(s, "\n\n")
	r := NewSSEReader(StreamOptions{Ratio: DefaultRatio})
	var got []int64
	for _, p := range parts[:3] {
		r.Write([]byte(p))
		got = append(got, r.OutputTokens())
	}
	if got[0] != 10 || got[1] != 10 || got[2] != 13 {
		t.Errorf("counts %v, want [10 10 13]", got)
	}
}

func TestResponsesDeltaTypes(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		want int64
	}{
		{"response.output_text.delta", 3},
		{"response.function_call_arguments.delta", 3},
		{"response.reasoning_summary_text.delta", 3},
		{"response.refusal.delta", 3},
		{"response.audio.delta", 0},      // base64 audio
		{"response.output_text.done", 0}, // repeats the text
		{"some.other.delta", 0},
		{"response..delta", 0}, // too short to be of the family
	} {
		// The type comes after the delta: the count waits for the event's end.
		body := `data: {"delta":"` + strings.Repeat("x", 12) + `","type":"` + tc.typ + `"}` + "\n\n"
		_, counts := readSSE(StreamOptions{}, [][]byte{[]byte(body)})
		if counts[0] != tc.want {
			t.Errorf("%s: OutputTokens = %d, want %d", tc.typ, counts[0], tc.want)
		}
	}
}

func TestSSEFraming(t *testing.T) {
	usage := `{"usage":{"input_tokens":2,"output_tokens":3}}`
	complete := Result{Usage: Usage{Input: 2, Output: 3}, Status: UsageComplete}
	for _, tc := range []struct {
		name   string
		stream string
		want   Result
	}{
		{"plain", "data: " + usage + "\n\n", complete},
		{"no space after the colon", "data:" + usage + "\n\n", complete},
		{"two spaces: the second is data", "data:  " + usage + "\n\n", complete},
		{"data over lines", "data: {\"usage\":\ndata: {\"input_tokens\":2,\ndata: \"output_tokens\":3}}\n\n", complete},
		{"comments, ids, retry, event names", ": keep-alive\nid: 7\nretry: 100\nevent: message_delta\ndata: " + usage + "\n\n", complete},
		{"an empty data line", "data\ndata: " + usage + "\n\n", complete},
		{"other fields are not data", "datax: {}\ndat: {}\nDATA: {}\ndata: " + usage + "\n\n", complete},
		{"no blank line at the end", "data: " + usage + "\n", complete},
		{"no line end at all", "data: " + usage, complete},
		{"blank lines between events", "\n\n\r\n" + "data: " + usage + "\n\n\n\n", complete},
		{"an empty event is no event", "event: ping\n\n", Result{}},
		{"a BOM-less field name with a colon in the value", "data: {\"usage\":{\"input_tokens\":2,\"output_tokens\":3},\"x\":\"a:b\"}\n\n", complete},
	} {
		want := tc.want
		want.Stats.Bytes = int64(len(tc.stream))
		if want.Status == UsageComplete {
			want.Stats.Events = 1
		}
		for _, c := range chunkings([]byte(tc.stream)) {
			if got, _ := readSSE(StreamOptions{}, c.chunks); got != want {
				t.Fatalf("%s, %s:\n got %+v\nwant %+v", tc.name, c.name, got, want)
			}
		}
	}
}

func TestSSEMalformedAndTruncated(t *testing.T) {
	good := "data: {\"usage\":{\"input_tokens\":2,\"output_tokens\":3}}\n\n"
	for _, tc := range []struct {
		name      string
		stream    string
		status    UsageStatus
		events    int64
		malformed int64
	}{
		{"a bad event among good ones", "data: {\"a\":\n\n" + good, UsageComplete, 2, 1},
		{"HTML instead of events", "data: <html>\n\n", UsageMissing, 1, 1},
		{"two objects in one event", "data: {} {}\n\n", UsageMissing, 1, 1},
		{"truncated in the last event", good + "data: {\"usage\":{\"input_tokens\":9,", UsageComplete, 2, 1},
		{"truncated before any usage", "data: {\"choices\":[{\"delta\":{\"content\":\"hi", UsageMissing, 1, 1},
		{"[DONE] with more", "data: [DONE] now\n\n", UsageMissing, 1, 1},
		{"a bad count", "data: {\"usage\":{\"input_tokens\":2,\"output_tokens\":-3}}\n\n" + good, UsageMalformed, 2, 0},
	} {
		got, _ := readSSE(StreamOptions{}, [][]byte{[]byte(tc.stream)})
		if got.Status != tc.status || got.Stats.Events != tc.events || got.Stats.Malformed != tc.malformed {
			t.Errorf("%s: %v, %d events, %d malformed; want %v, %d, %d", tc.name,
				got.Status, got.Stats.Events, got.Stats.Malformed, tc.status, tc.events, tc.malformed)
		}
	}
}

// TestOversizedEvent: an event past the bound is skipped and counted, its
// data counted as text, and the events after it are read; the reader's
// memory does not grow with it.
func TestOversizedEvent(t *testing.T) {
	huge := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("z", 1<<20) + "\"}}]}\n\n"
	good := "data: {\"usage\":{\"input_tokens\":2,\"output_tokens\":3}}\n\n"
	r := NewSSEReader(StreamOptions{MaxEventBytes: 64 << 10})
	hugeBytes := []byte(huge)
	if n := testing.AllocsPerRun(1, func() {
		for b := hugeBytes; len(b) > 0; b = b[min(len(b), 16<<10):] {
			r.Write(b[:min(len(b), 16<<10)])
		}
	}); n != 0 {
		t.Errorf("an oversized event allocates %v times", n)
	}
	r.Write([]byte(good))
	got := r.Result()
	if got.Stats.Oversized != 2 || got.Status != UsageComplete { // AllocsPerRun ran it twice
		t.Errorf("Result = %+v", got)
	}
	if r.OutputTokens() < (1<<20)/4 {
		t.Errorf("OutputTokens = %d: the oversized text was not counted", r.OutputTokens())
	}
	// A line that never ends (no data): skipped and counted at its end.
	r.Reset(StreamOptions{MaxEventBytes: 1000})
	r.Write([]byte(": " + strings.Repeat("c", 5000) + "\n\n" + good))
	if got := r.Result(); got.Stats.Oversized != 1 || got.Status != UsageComplete || got.Stats.Events != 1 {
		t.Errorf("after a long comment: %+v", got)
	}
}

func TestPendingAndSequence(t *testing.T) {
	body := fixture(t, "stream/responses.sse")
	r := NewSSEReader(StreamOptions{})
	if r.NextSequence() != 0 {
		t.Errorf("NextSequence before any event = %d", r.NextSequence())
	}
	cut := bytes.Index(body, []byte("event: response.output_text.delta"))
	r.Write(body[:cut+10])
	if got := r.Pending(); got != 10 {
		t.Errorf("Pending = %d, want the 10 bytes of the event begun", got)
	}
	if got := r.NextSequence(); got != 4 {
		t.Errorf("NextSequence = %d, want 4", got)
	}
	r.Write(body[cut+10:])
	if r.Pending() != 0 || r.NextSequence() != 10 {
		t.Errorf("at the end: Pending %d, NextSequence %d", r.Pending(), r.NextSequence())
	}
}

func TestSSEReaderAllocatesNothing(t *testing.T) {
	body := fixture(t, "stream/anthropic.sse")
	r := NewSSEReader(StreamOptions{})
	if n := testing.AllocsPerRun(100, func() {
		r.Reset(StreamOptions{})
		for b := body; len(b) > 0; b = b[min(len(b), 97):] {
			r.Write(b[:min(len(b), 97)])
			_ = r.OutputTokens()
		}
		_ = r.Result()
	}); n != 0 {
		t.Errorf("a stream allocates %v times", n)
	}
}

// TestReaderSizes holds the readers' memory, which is all they keep of a
// body whatever its size, to the bounds doc.go states.
func TestReaderSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"SSEReader", unsafe.Sizeof(SSEReader{}), 2700},
		{"RequestReader", unsafe.Sizeof(RequestReader{}), 1100},
		{"JSONReader", unsafe.Sizeof(JSONReader{}), 1100},
	} {
		if tc.size > tc.max {
			t.Errorf("%s is %d bytes, more than the %d doc.go states", tc.name, tc.size, tc.max)
		}
	}
}

// TestWriteEventMatchesWrite: fed event by event (WriteEvent), in chunks
// cut anywhere, with LF and CR LF line ends, a reader reads what Write
// reads, stops at the end of each event (Pending 0, the next byte starts
// the next event), and ends as many events as the stream has.
func TestWriteEventMatchesWrite(t *testing.T) {
	for _, c := range sseFixtures {
		for _, crlf := range []bool{false, true} {
			body := fixture(t, "stream/"+c.file)
			if crlf {
				body = bytes.ReplaceAll(body, []byte("\n"), []byte("\r\n"))
			}
			want, _ := readSSE(StreamOptions{}, [][]byte{body})
			events := bytes.Count(body, []byte("\n\n"))
			if crlf {
				events = bytes.Count(body, []byte("\r\n\r\n"))
			}
			for _, size := range []int{1, 7, 64, len(body)} {
				r := NewSSEReader(StreamOptions{})
				ends, total := 0, 0
				for start := 0; start < len(body); start += size {
					chunk := body[start:min(start+size, len(body))]
					for len(chunk) > 0 {
						n, ended := r.WriteEvent(chunk)
						if n == 0 {
							t.Fatalf("%s: WriteEvent read nothing of %d bytes", c.file, len(chunk))
						}
						chunk, total = chunk[n:], total+n
						if ended {
							ends++
							if r.Pending() != 0 {
								t.Fatalf("%s (size %d): an event ended with %d bytes pending", c.file, size, r.Pending())
							}
						}
					}
				}
				if got := r.Result(); got != want || total != len(body) || ends != events {
					t.Fatalf("%s (crlf %v, size %d): %+v, %d bytes, %d events ended; want %+v, %d, %d",
						c.file, crlf, size, got, total, ends, want, len(body), events)
				}
			}
		}
	}
}
