package llm

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/llm/internal/jsontest"
)

// A second reading of the same formats, written the obvious way with
// encoding/json on whole bodies, to check the readers against: the fuzz
// targets below compare the two on any input.

// refEvents splits an SSE stream into its events' data as the HTML
// standard's event stream parser does (a last event without its blank
// line included, as the SSEReader does).
func refEvents(stream string) []string {
	stream = strings.ReplaceAll(strings.ReplaceAll(stream, "\r\n", "\n"), "\r", "\n")
	var events []string
	var data []string
	has := false
	for _, line := range strings.Split(stream, "\n") {
		if line == "" {
			if has {
				events = append(events, strings.Join(data, "\n"))
			}
			data, has = nil, false
			continue
		}
		name, value, colon := strings.Cut(line, ":")
		if !colon {
			value = ""
		}
		if name == "data" {
			data, has = append(data, strings.TrimPrefix(value, " ")), true
		}
	}
	if has {
		events = append(events, strings.Join(data, "\n"))
	}
	return events
}

// refObject decodes a document that must be one JSON object, nested at
// most 64 deep and without duplicate keys (ok false otherwise; valid says
// whether it is a JSON object at all).
func refObject(doc []byte) (m map[string]json.RawMessage, valid, ok bool) {
	if !jsontest.ValidObject(doc, 64) {
		return nil, false, false
	}
	if err := json.Unmarshal(doc, &m); err != nil {
		return nil, false, false
	}
	return m, true, !hasDuplicateKeys(doc)
}

// hasDuplicateKeys reports whether any object of a valid doc repeats a key
// (the readers merge repeated objects where a map keeps the last).
func hasDuplicateKeys(doc []byte) bool {
	d := json.NewDecoder(bytes.NewReader(doc))
	type level struct {
		obj  bool
		key  bool // the next string token is a key
		keys map[string]bool
	}
	var stack []level
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		if len(stack) > 0 && stack[len(stack)-1].obj && stack[len(stack)-1].key {
			if k, isKey := tok.(string); isKey {
				top := &stack[len(stack)-1]
				if top.keys[k] {
					return true
				}
				top.keys[k], top.key = true, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{obj: true, key: true, keys: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].key = true // a value ended: a key comes next
		}
	}
}

// refInt reads a count: set for a whole number in [0, MaxTokens] as
// digits only, bad for any other value but null.
func refInt(raw json.RawMessage) (v int64, set, bad bool) {
	s := string(bytes.TrimSpace(raw))
	if s == "null" || s == "" {
		return 0, false, false
	}
	if strings.Trim(s, "0123456789") != "" || len(s) > 1 && s[0] == '0' {
		return 0, false, true
	}
	var n json.Number = json.Number(s)
	i, err := n.Int64()
	if err != nil || i > MaxTokens {
		return 0, false, true
	}
	return i, true, false
}

// refField is m[key] as an object (nil if absent or not an object).
func refField(m map[string]json.RawMessage, key string) map[string]json.RawMessage {
	var o map[string]json.RawMessage
	if raw, ok := m[key]; ok && bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		_ = json.Unmarshal(raw, &o)
	}
	return o
}

// refCommit adds one event's (or body's) usage objects to acc and
// reports whether it is an error event; ambiguous when the event has two
// names for one count (then the readers keep the one written last, and
// a map cannot say which that was).
func refCommit(acc *usageAcc, m map[string]json.RawMessage) (isError, ambiguous bool) {
	names := [rawCount][]string{{"prompt_tokens", "input_tokens"}, {"completion_tokens", "output_tokens"},
		{"cached_tokens"}, {"cache_read_input_tokens"}, {"cache_creation_input_tokens"}}
	read := func(u map[string]json.RawMessage, final bool) {
		if u == nil {
			return
		}
		for k, keys := range names {
			objs := []map[string]json.RawMessage{u}
			if k == rawCachedPart {
				objs = nil
				for _, d := range []string{"prompt_tokens_details", "input_tokens_details"} {
					if _, has := u[d]; has {
						objs = append(objs, refField(u, d))
					}
				}
			}
			found := 0
			for _, obj := range objs {
				for _, key := range keys {
					if _, has := obj[key]; has {
						found++
					}
					v, set, bad := refInt(obj[key])
					refSet(acc, k, v, set, bad, final)
				}
			}
			ambiguous = ambiguous || found > 1 || len(objs) > 1
		}
	}
	_, hasUsage := m["usage"]
	_, hasResponse := m["response"]
	ambiguous = hasUsage && hasResponse
	read(refField(refField(m, "message"), "usage"), false)
	read(refField(m, "usage"), true)
	read(refField(refField(m, "response"), "usage"), true)
	var typ string
	_ = json.Unmarshal(m["type"], &typ)
	e, hasError := m["error"]
	isError = hasError && string(bytes.TrimSpace(e)) != "null" || typ == "error" || typ == "response.failed"
	return isError, ambiguous
}

func refSet(acc *usageAcc, k int, v int64, set, bad, final bool) {
	acc.malformed = acc.malformed || bad
	if set || bad {
		acc.final = acc.final || final
	}
	if set {
		acc.v[k], acc.seen = v, acc.seen|1<<k
	}
}

// refSSE reads a whole stream the obvious way.
func refSSE(stream []byte) (r Result, ok bool) {
	var acc usageAcc
	ok = true
	for _, data := range refEvents(string(stream)) {
		r.Stats.Events++
		if data == "[DONE]" {
			r.Stats.Done = true
			continue
		}
		m, valid, dupFree := refObject([]byte(data))
		if !valid {
			r.Stats.Malformed++
			continue
		}
		isError, ambiguous := refCommit(&acc, m)
		ok = ok && dupFree && !ambiguous
		if isError {
			r.Stats.Errors++
		}
	}
	r.Usage, r.Status = acc.result()
	r.Stats.Bytes = int64(len(stream))
	return r, ok
}

// refRequest reads a whole request body the obvious way.
func refRequest(body []byte) (q Request, ok bool) {
	m, valid, ok := refObject(body)
	if !valid {
		return Request{Status: RequestMalformed}, true
	}
	q = Request{Choices: 1}
	var model string
	if json.Unmarshal(m["model"], &model) == nil && len(model) <= MaxModelBytes && !strings.ContainsRune(model, '\ufffd') {
		q.Model = model
	} else if strings.ContainsRune(model, '\ufffd') {
		ok = false // invalid UTF-8 or lone surrogates: encoding/json and the capture may differ
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		if v, set, _ := refInt(m[k]); set {
			q.MaxOutputSet, q.MaxOutput = true, max(q.MaxOutput, v)
		}
	}
	if v, set, _ := refInt(m["n"]); set && v >= 1 {
		q.Choices = v
	}
	_ = json.Unmarshal(m["stream"], &q.Stream)
	if so := refField(m, "stream_options"); so != nil {
		_ = json.Unmarshal(so["include_usage"], &q.IncludeUsage)
	}
	for _, k := range []string{"messages", "system", "input", "instructions"} {
		q.PromptBytes += refText(m[k], true)
	}
	if raw, has := m["tools"]; has && len(raw) > 0 && (raw[0] == '[' || raw[0] == '{') {
		q.PromptBytes += int64(len(raw))
	}
	return q, ok
}

// refText counts the text of a value as the request schema does;
// measure says whether its strings are text.
func refText(raw json.RawMessage, measure bool) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch raw[0] {
	case '"':
		if measure {
			return utf8Len(raw)
		}
	case '[':
		var items []json.RawMessage
		_ = json.Unmarshal(raw, &items)
		var n int64
		for _, it := range items {
			n += refText(it, measure)
		}
		return n
	case '{':
		var m map[string]json.RawMessage
		_ = json.Unmarshal(raw, &m)
		var n int64
		for k, v := range m {
			switch k {
			case "content", "text", "arguments", "output", "refusal":
				n += refText(v, true)
			case "tool_calls", "function":
				n += refText(v, false)
			case "input":
				if v = bytes.TrimSpace(v); len(v) > 0 && (v[0] == '{' || v[0] == '[') {
					n += int64(len(v))
				} else {
					n += refText(v, true)
				}
			}
		}
		return n
	}
	return 0
}

// utf8Len is the length of a JSON string literal once decoded, counting
// each half of a surrogate pair (and a lone one) as 2 bytes as the
// scanner does, and each byte of invalid UTF-8 as 1.
func utf8Len(lit []byte) int64 {
	var n int64
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			n++
			continue
		}
		i++
		if s[i] != 'u' {
			n++
			continue
		}
		var u uint16
		for _, c := range s[i+1 : i+5] {
			u <<= 4
			switch {
			case c >= '0' && c <= '9':
				u |= uint16(c - '0')
			case c >= 'a' && c <= 'f':
				u |= uint16(c - 'a' + 10)
			default:
				u |= uint16(c - 'A' + 10)
			}
		}
		i += 4
		switch {
		case u < 0x80:
			n++
		case u < 0x800 || u >= 0xD800 && u < 0xE000:
			n += 2
		default:
			n += 3
		}
	}
	return n
}

func FuzzSSEReader(f *testing.F) {
	for _, tc := range sseFixtures {
		f.Add(fixture(f, "stream/"+tc.file), uint16(100), uint16(7))
	}
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":1}}\r\n\r\ndata: [DONE]\r\r"), uint16(3), uint16(1))
	f.Fuzz(func(t *testing.T, stream []byte, cut, step uint16) {
		whole, _ := readSSE(StreamOptions{}, [][]byte{stream})
		// Any chunking reads the same: a cut, then pieces of step bytes.
		var chunks [][]byte
		rest := stream
		if k := min(int(cut), len(rest)); k > 0 {
			chunks, rest = append(chunks, rest[:k]), rest[k:]
		}
		for n := max(1, int(step)%64); len(rest) > 0; rest = rest[min(n, len(rest)):] {
			chunks = append(chunks, rest[:min(n, len(rest))])
		}
		parts, counts := readSSE(StreamOptions{}, chunks)
		if parts != whole {
			t.Fatalf("chunked %+v, whole %+v", parts, whole)
		}
		// The memo changes nothing but the cost.
		plain := NewSSEReader(StreamOptions{})
		plain.noMemo = true
		for i, c := range chunks {
			if plain.Write(c); plain.OutputTokens() != counts[i] {
				t.Fatalf("after chunk %d: %d tokens without the memo, %d with it", i, plain.OutputTokens(), counts[i])
			}
		}
		if got := plain.Result(); got != whole {
			t.Fatalf("without the memo %+v, with it %+v", got, whole)
		}
		// Event by event, the same again; an event ends with nothing
		// pending.
		events := NewSSEReader(StreamOptions{})
		for _, c := range chunks {
			for len(c) > 0 {
				n, ended := events.WriteEvent(c)
				if n == 0 || (ended && events.Pending() != 0) {
					t.Fatalf("WriteEvent read %d of %d bytes, ended %v with %d pending", n, len(c), ended, events.Pending())
				}
				c = c[n:]
			}
		}
		if got := events.Result(); got != whole {
			t.Fatalf("event by event %+v, whole %+v", got, whole)
		}
		for i := 1; i < len(counts); i++ {
			if counts[i] < counts[i-1] {
				t.Fatalf("the running count fell: %v", counts)
			}
		}
		if want, ok := refSSE(stream); ok && whole != want {
			t.Fatalf("reader %+v\n   ref %+v", whole, want)
		}
	})
}

func FuzzRequest(f *testing.F) {
	for _, name := range []string{"chat.json", "chat-tools.json", "responses.json", "responses-items.json", "anthropic.json", "unknown.json"} {
		f.Add(fixture(f, "request/"+name), uint16(40))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		whole := ReadRequest(body, 1<<20)
		r := NewRequestReader(1 << 20)
		k := min(int(cut), len(body))
		r.Write(body[:k])
		r.Write(body[k:])
		if parts := r.Result(); parts != whole {
			t.Fatalf("cut at %d: %+v, whole %+v", k, parts, whole)
		}
		if want, ok := refRequest(body); ok && whole != want {
			t.Fatalf("reader %+v\n   ref %+v", whole, want)
		}
	})
}

func FuzzJSONReader(f *testing.F) {
	for _, name := range []string{"chat.json", "responses.json", "anthropic.json", "anthropic-error.json"} {
		f.Add(fixture(f, "answer/"+name), uint16(50))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		whole := readJSON([][]byte{body})
		k := min(int(cut), len(body))
		if parts := readJSON([][]byte{body[:k], body[k:]}); parts != whole {
			t.Fatalf("cut at %d: %+v, whole %+v", k, parts, whole)
		}
		m, valid, ok := refObject(body)
		var acc usageAcc
		ambiguous := false
		if valid {
			_, ambiguous = refCommit(&acc, m)
		}
		u, st := acc.result()
		if ok && !ambiguous && (whole.Usage != u || whole.Status != st) {
			t.Fatalf("reader %+v %v, ref %+v %v", whole.Usage, whole.Status, u, st)
		}
	})
}
