package jsonscan

import (
	"strings"
	"testing"
)

// chunk is an OpenAI chat chunk: mostly keys and values nobody wants.
const chunk = `{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1767225600,` +
	`"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{"content":"river "},` +
	`"logprobs":null,"finish_reason":null}],"usage":null}`

func benchmarkScan(b *testing.B, doc string) {
	data := []byte(doc)
	s := NewScanner(schema)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		s.Write(data)
		if !s.Complete() {
			b.Fatal("not complete")
		}
	}
}

// BenchmarkTokens: per-token cost.
func BenchmarkTokens(b *testing.B) { benchmarkScan(b, chunk) }

// BenchmarkText: per-byte cost of text.
func BenchmarkText(b *testing.B) {
	benchmarkScan(b, `{"rec":[{"k":"`+strings.Repeat("the river runs north past the old mill ", 100)+`"}]}`)
}

// BenchmarkMemo: the chunk again, its prefix taken from a Memo.
func BenchmarkMemo(b *testing.B) {
	data := []byte(chunk)
	s := NewScanner(schema)
	var m Memo
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		m.Begin()
		m.Line(s, data)
		m.End(s, false)
		if !s.Complete() {
			b.Fatal("not complete")
		}
	}
}
