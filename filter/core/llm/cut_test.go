package llm

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAppendCutEvent(t *testing.T) {
	const msg = "token budget \"monthly\" spent\n\x01 \u2028 \xff end"
	for _, tc := range []struct {
		f     Format
		event string // the event: line, "" for none
		data  string // the data as JSON, with the message's decoding
	}{
		{OpenAIChat, "", `{"error":{"message":"M","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`},
		{OpenAIResponses, "error", `{"type":"error","code":"rate_limit_exceeded","message":"M","param":null,"sequence_number":7}`},
		{Anthropic, "error", `{"type":"error","error":{"type":"rate_limit_error","message":"M"}}`},
	} {
		ev := string(AppendCutEvent([]byte("prefix"), tc.f, msg, 7))
		ev, ok := strings.CutPrefix(ev, "prefix")
		if !ok || !strings.HasSuffix(ev, "\n\n") || strings.Count(ev, "\n") != 2+btoi(tc.event != "") {
			t.Fatalf("%v: not one event of one data line: %q", tc.f, ev)
		}
		lines := strings.Split(strings.TrimSuffix(ev, "\n\n"), "\n")
		if tc.event != "" {
			if lines[0] != "event: "+tc.event {
				t.Errorf("%v: event line %q", tc.f, lines[0])
			}
			lines = lines[1:]
		}
		data, ok := strings.CutPrefix(lines[0], "data: ")
		if !ok {
			t.Fatalf("%v: no data line: %q", tc.f, ev)
		}
		var got, want any
		if err := json.Unmarshal([]byte(data), &got); err != nil {
			t.Fatalf("%v: data is not JSON: %v: %s", tc.f, err, data)
		}
		wantMsg, _ := json.Marshal(strings.ToValidUTF8(msg, "\ufffd"))
		if err := json.Unmarshal([]byte(strings.Replace(tc.data, `"M"`, string(wantMsg), 1)), &want); err != nil {
			t.Fatal(err)
		}
		if gj, wj := mustJSON(got), mustJSON(want); gj != wj {
			t.Errorf("%v:\n got %s\nwant %s", tc.f, gj, wj)
		}
	}
}

// TestCutEventIsRead: the event the filter sends is one the readers take
// for what it is: an error, not usage.
func TestCutEventIsRead(t *testing.T) {
	for _, f := range []Format{OpenAIChat, OpenAIResponses, Anthropic} {
		got, _ := readSSE(StreamOptions{}, [][]byte{AppendCutEvent(nil, f, "spent", 3)})
		if got.Stats.Errors != 1 || got.Stats.Malformed != 0 || got.Status != UsageMissing {
			t.Errorf("%v: %+v", f, got)
		}
	}
}

func TestAppendCutEventAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() {
		buf = AppendCutEvent(buf[:0], OpenAIResponses, "token budget spent", 12)
	}); n != 0 {
		t.Errorf("AppendCutEvent allocates %v times", n)
	}
}

func TestFormatOf(t *testing.T) {
	for _, tc := range []struct {
		path string
		f    Format
		ok   bool
	}{
		{"/v1/chat/completions", OpenAIChat, true},
		{"/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", OpenAIChat, true},
		{"/v1/responses", OpenAIResponses, true},
		{"/v1/responses/", OpenAIResponses, true},
		{"/v1/messages", Anthropic, true},
		{"/v1/messages?beta=true", Anthropic, true},
		{"/v1/completions", OpenAIChat, false},
		{"/v1/messages/count_tokens", OpenAIChat, false},
		{"", OpenAIChat, false},
	} {
		if f, ok := FormatOf(tc.path); f != tc.f || ok != tc.ok {
			t.Errorf("FormatOf(%q) = %v, %v; want %v, %v", tc.path, f, ok, tc.f, tc.ok)
		}
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
