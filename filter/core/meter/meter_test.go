package meter

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/llm"
)

// chunkBody is a chunk as a host shows it.
type chunkBody []byte

func (b chunkBody) ResponseBody(start, max int) ([]byte, error) {
	if start >= len(b) {
		return nil, nil
	}
	return b[start:min(start+max, len(b))], nil
}

// allowUpTo is a budget of out output tokens; it counts its questions.
type allowUpTo struct {
	out   int64
	asked int
}

func (a *allowUpTo) Allow(out int64) bool { a.asked++; return out <= a.out }

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "llm", "testdata", "stream", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chunks cuts b into pieces of random sizes from 1 to max.
func chunks(r *rand.Rand, b []byte, max int) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(max))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// run passes a stream's chunks through a Stream with budget b and returns
// what the client gets (each chunk as Chunk shapes it) and the shapes.
func run(t *testing.T, s *Stream, pieces [][]byte, b Budget, holdMax int) ([]byte, []Shape) {
	t.Helper()
	var client []byte
	var shapes []Shape
	var scratch []byte
	for _, p := range pieces {
		out, shape, err := s.Chunk(chunkBody(p), len(p), b, holdMax, scratch[:0])
		if err != nil {
			t.Fatal(err)
		}
		if shape.Changed {
			client = append(client, out...)
		} else {
			client = append(client, p...)
		}
		shapes = append(shapes, shape)
		scratch = out
	}
	return client, shapes
}

// events splits an SSE stream at its blank lines (LF line ends).
func events(b []byte) []string {
	var out []string
	for _, e := range strings.SplitAfter(string(b), "\n\n") {
		if e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TestChunkPassesEverythingWithinBudget: whatever the chunking, a stream
// within its budget reaches the client byte for byte, and every chunk the
// client gets ends at the end of an event (the unfinished ones are held
// back until they end).
func TestChunkPassesEverythingWithinBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{"anthropic.sse", "chat-usage.sse", "responses.sse", "chat-tools.sse"} {
		body := fixture(t, name)
		for trial := range 50 {
			s := new(Stream)
			s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
			pieces := chunks(r, body, 1+trial*5)
			var sent []byte
			var scratch []byte
			for _, p := range pieces {
				out, shape, err := s.Chunk(chunkBody(p), len(p), &allowUpTo{out: 1 << 40}, 1<<20, scratch[:0])
				if err != nil || shape.Cut {
					t.Fatalf("%s: %v, %+v", name, err, shape)
				}
				if !shape.Changed {
					out = p
				}
				sent = append(sent, out...)
				if len(out) > 0 && !bytes.HasSuffix(sent, []byte("\n\n")) {
					t.Fatalf("%s: the client got part of an event: %q", name, sent[max(0, len(sent)-40):])
				}
				scratch = out
			}
			if !bytes.Equal(sent, body) {
				t.Fatalf("%s (trial %d): the client got\n%q\nwant\n%q", name, trial, sent, body)
			}
			if want, _ := readAll(body); s.Result() != want {
				t.Fatalf("%s: %+v, want %+v", name, s.Result(), want)
			}
		}
	}
}

// readAll is the result of a reader fed the whole stream.
func readAll(body []byte) (llm.Result, int64) {
	r := llm.NewSSEReader(llm.StreamOptions{})
	r.Write(body)
	return r.Result(), r.OutputTokens()
}

// TestChunkCutsBetweenEvents: a budget that runs out cuts the stream
// before the first event it refuses, whatever the chunking: the client
// gets the events before it, whole, then the cut event in the request's
// format, and nothing after; the rest is still read (its usage counts).
func TestChunkCutsBetweenEvents(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	body := fixture(t, "anthropic.sse")
	evs := events(body)
	// The running count after each event, alone.
	counts := make([]int64, len(evs))
	ref := llm.NewSSEReader(llm.StreamOptions{})
	for i, e := range evs {
		ref.Write([]byte(e))
		counts[i] = ref.OutputTokens()
	}
	final, _ := readAll(body)
	for budget := int64(0); budget <= counts[len(counts)-1]; budget++ {
		// The events the budget lets through: those before the first whose
		// count passes it.
		keep := 0
		for keep < len(evs) && counts[keep] <= budget {
			keep++
		}
		want := strings.Join(evs[:keep], "") + string(llm.AppendCutEvent(nil, llm.Anthropic, CutMessage, 0))
		if keep == len(evs) {
			want = string(body)
		}
		for trial := range 20 {
			s := new(Stream)
			s.Format = llm.Anthropic
			s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
			got, shapes := run(t, s, chunks(r, body, 1+trial*7), &allowUpTo{out: budget}, 1<<20)
			if string(got) != want {
				t.Fatalf("budget %d (trial %d): the client got\n%s\nwant\n%s", budget, trial, got, want)
			}
			cuts := 0
			for _, sh := range shapes {
				if sh.Cut {
					cuts++
				}
			}
			if cuts != s.Cuts || (keep < len(evs)) != (cuts == 1) || !s.Cut() == (cuts == 1) {
				t.Fatalf("budget %d: %d cuts (Cuts %d, Cut %v)", budget, cuts, s.Cuts, s.Cut())
			}
			if s.Result() != final {
				t.Fatalf("budget %d: the usage after the cut %+v, want %+v (the rest is read)", budget, s.Result(), final)
			}
		}
	}
}

// TestChunkLongEventGoesOut: an event longer than the hold bound goes out
// as it comes; a cut before the next event still ends the stream between
// events, and a cut of the long event itself ends it with a blank line.
func TestChunkLongEventGoesOut(t *testing.T) {
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 400) + "\"}}]}\n\n"
	short := "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n"
	body := []byte(short + long + short)
	pieces := [][]byte{body[:len(short)+100], body[len(short)+100 : len(short)+300], body[len(short)+300:]}
	for _, tt := range []struct {
		budget int64
		want   string
	}{
		{1 << 40, string(body)},
		{1, short + long[:300-0] + "\n\n" + string(llm.AppendCutEvent(nil, llm.OpenAIChat, CutMessage, 0))},
	} {
		s := new(Stream)
		s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
		got, _ := run(t, s, pieces, &allowUpTo{out: tt.budget}, 64)
		if string(got) != tt.want {
			t.Fatalf("budget %d: the client got\n%q\nwant\n%q", tt.budget, got, tt.want)
		}
		if s.Overlong != 1 {
			t.Fatalf("budget %d: Overlong %d", tt.budget, s.Overlong)
		}
	}
}

// TestChunkWithoutBudget: a stream that may not be cut, or a JSON answer,
// goes on untouched, and its usage is read.
func TestChunkWithoutBudget(t *testing.T) {
	body := fixture(t, "chat-usage.sse")
	s := new(Stream)
	s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
	for _, p := range chunks(rand.New(rand.NewPCG(5, 6)), body, 9) {
		if _, shape, err := s.Chunk(chunkBody(p), len(p), nil, 0, nil); err != nil || shape.Changed {
			t.Fatalf("%+v %v", shape, err)
		}
	}
	if want, _ := readAll(body); s.Result() != want {
		t.Fatalf("%+v, want %+v", s.Result(), want)
	}
	j := new(Stream)
	j.BeginAnswer(AnswerJSON, llm.StreamOptions{})
	doc := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)
	if _, shape, _ := j.Chunk(chunkBody(doc), len(doc), &allowUpTo{}, 0, nil); shape.Changed {
		t.Fatal("a JSON answer was changed")
	}
	if res := j.Result(); res.Status != llm.UsageComplete || res.Usage.Output != 4 {
		t.Fatalf("%+v", res)
	}
}

// TestPoolKeepsNothingOfAStream: a Stream back in the pool is empty, keeps
// its readers, and drops a held buffer that grew large.
func TestPoolKeepsNothingOfAStream(t *testing.T) {
	var p Pool
	s := p.Get()
	s.BeginRequest(100)
	s.WriteRequest([]byte(`{"model":"m","max_tokens":5}`))
	if q := s.EndRequest(); q.Model != "m" || q.MaxOutput != 5 {
		t.Fatalf("%+v", q)
	}
	s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
	s.held = make([]byte, 0, 2*maxKeptHeld)
	p.Put(s)
	if p.Live() != 0 {
		t.Fatalf("%d live", p.Live())
	}
	s2 := p.Get()
	if s2 != s || s2.held != nil || s2.Request.Model != "" || s2.answer != AnswerNone || s2.req == nil || s2.sse == nil {
		t.Fatalf("%+v", s2)
	}
}

func TestAnswerOf(t *testing.T) {
	for ct, want := range map[string]Answer{"text/event-stream": AnswerSSE, "Text/Event-Stream; charset=utf-8": AnswerSSE,
		"application/json": AnswerJSON, "": AnswerJSON, "text/plain": AnswerJSON} {
		if got := AnswerOf(ct); got != want {
			t.Errorf("%q: %d, want %d", ct, got, want)
		}
	}
}

// TestChunkAllocatesNothing: a stream's chunks, held back or not, allocate
// nothing once the buffers have grown.
func TestChunkAllocatesNothing(t *testing.T) {
	body := fixture(t, "chat-usage.sse")
	pieces := chunks(rand.New(rand.NewPCG(7, 8)), body, 13)
	s := new(Stream)
	scratch := make([]byte, 0, 1<<10)
	s.held = make([]byte, 0, 1<<10)
	b := &allowUpTo{out: 1 << 40}
	bodies := make([]Body, len(pieces)) // (a slice in an interface is boxed: once, here)
	for i, p := range pieces {
		bodies[i] = chunkBody(p)
	}
	allocs := testing.AllocsPerRun(20, func() {
		s.BeginAnswer(AnswerSSE, llm.StreamOptions{})
		for i, p := range pieces {
			scratch, _, _ = s.Chunk(bodies[i], len(p), b, 1<<20, scratch[:0])
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per stream", allocs)
	}
}
