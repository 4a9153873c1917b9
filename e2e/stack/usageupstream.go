package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The request headers that tell a UsageUpstream what to answer.
const (
	// UsageTokensHeader: the usage (tokens) to report for this request.
	UsageTokensHeader = "x-test-tokens"
	// UsageModeHeader: "header" (the default) reports the usage as the
	// response header x-usage-tokens; "trailer" streams the body and
	// reports it as the trailer x-usage-tokens at the end.
	UsageModeHeader = "x-test-usage-in"
	// UsageHoldHeader: the name of a gate; the upstream sends its first
	// chunk, then waits until the test calls Release(name) before the rest.
	UsageHoldHeader = "x-test-hold"
)

// UsageReportHeader is the response header or trailer that carries a
// request's usage.
const UsageReportHeader = "x-usage-tokens"

// UsageChunk is the size of each response body chunk, in bytes; a response
// has UsageChunks of them.
const (
	UsageChunk  = 64
	UsageChunks = 3
)

// UsageUpstream is an LLM-like backend: it answers each request with a
// streamed body of UsageChunks chunks and reports the request's usage
// (UsageTokensHeader) in the response header or trailer x-usage-tokens. It
// is served over HTTP/1.1 and h2c (prior knowledge), so that a cluster
// speaking HTTP/2 to it receives the trailer.
//
// It is the ground truth of the usage tests: Reported counts, per value of
// the key header, the usage it actually sent (a trailer whose stream was
// reset first is not counted).
type UsageUpstream struct {
	srv    *http.Server
	ln     net.Listener
	header string // key header: usage is counted per value

	mu       sync.Mutex
	reported map[string]int64         // usage sent, by key
	usages   map[string]LLMUsage      // LLM usage sent, by key (llmupstream.go)
	requests map[string]int64         // requests that reached it, by key
	gates    map[string]chan struct{} // hold gates, by name
	canceled atomic.Int64             // streams reset before their end
}

// StartUsageUpstream serves a UsageUpstream on addr ("127.0.0.1:0" picks a
// free port), counting per value of keyHeader.
func StartUsageUpstream(addr, keyHeader string) (*UsageUpstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("usage upstream: listen on %s: %w", addr, err)
	}
	u := &UsageUpstream{ln: ln, header: keyHeader,
		reported: map[string]int64{}, requests: map[string]int64{}, gates: map[string]chan struct{}{}, usages: map[string]LLMUsage{}}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	u.srv.Protocols.SetHTTP1(true)
	u.srv.Protocols.SetUnencryptedHTTP2(true)
	go u.srv.Serve(ln)
	return u, nil
}

// gate returns the gate named name, creating it.
func (u *UsageUpstream) gate(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.gates[name]
	if !ok {
		g = make(chan struct{})
		u.gates[name] = g
	}
	return g
}

// Release lets every request held on gate name (now or later) finish.
func (u *UsageUpstream) Release(name string) {
	g := u.gate(name)
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-g:
	default:
		close(g)
	}
}

// ServeHTTP streams the answer and reports the usage asked for: in a
// header or trailer, or, when the request names an LLM API's format
// (LLMFormatHeader), in the answer's own usage object (llmupstream.go).
func (u *UsageUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(u.header)
	if r.Header.Get(LLMFormatHeader) != "" {
		io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.requests[key]++
		u.mu.Unlock()
		u.serveLLM(w, r, key)
		return
	}
	tokens, err := strconv.ParseInt(r.Header.Get(UsageTokensHeader), 10, 64)
	if err != nil || tokens < 0 {
		http.Error(w, "usage upstream: "+UsageTokensHeader+" must be a number >= 0", http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.requests[key]++
	u.mu.Unlock()
	trailer := r.Header.Get(UsageModeHeader) == "trailer"
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	if trailer {
		h.Set("Trailer", UsageReportHeader)
	} else {
		h.Set(UsageReportHeader, strconv.FormatInt(tokens, 10))
		u.report(key, tokens)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := range UsageChunks {
		if i == 1 {
			if name := r.Header.Get(UsageHoldHeader); name != "" {
				select {
				case <-u.gate(name):
				case <-r.Context().Done():
				}
			}
		}
		if r.Context().Err() != nil {
			u.canceled.Add(1)
			return
		}
		line := fmt.Sprintf("chunk %d of %d ", i+1, UsageChunks)
		w.Write([]byte(line + strings.Repeat(".", UsageChunk-len(line)-1) + "\n"))
		if err := rc.Flush(); err != nil {
			u.canceled.Add(1)
			return
		}
	}
	if trailer {
		if r.Context().Err() != nil {
			u.canceled.Add(1)
			return
		}
		h.Set(UsageReportHeader, strconv.FormatInt(tokens, 10))
		u.report(key, tokens)
	}
}

// report counts tokens of usage sent for key.
func (u *UsageUpstream) report(key string, tokens int64) {
	u.mu.Lock()
	u.reported[key] += tokens
	u.mu.Unlock()
}

// reportUsage counts an LLM usage sent for key (its total in Reported).
func (u *UsageUpstream) reportUsage(key string, usage LLMUsage) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.reported[key] += usage.Total()
	s := u.usages[key]
	s.Input, s.Cached, s.Output = s.Input+usage.Input, s.Cached+usage.Cached, s.Output+usage.Output
	u.usages[key] = s
}

// ReportedUsage returns the LLM usage the upstream reported for key.
func (u *UsageUpstream) ReportedUsage(key string) LLMUsage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.usages[key]
}

// Reported returns the usage the upstream reported for key.
func (u *UsageUpstream) Reported(key string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reported[key]
}

// Requests returns how many requests for key reached the upstream.
func (u *UsageUpstream) Requests(key string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests[key]
}

// Canceled returns how many streams were reset before their end.
func (u *UsageUpstream) Canceled() int64 { return u.canceled.Load() }

// Addr returns the upstream's listen address.
func (u *UsageUpstream) Addr() string { return u.ln.Addr().String() }

// Close stops the upstream: held requests are released, then it waits up
// to ctx for requests in progress.
func (u *UsageUpstream) Close(ctx context.Context) error {
	u.mu.Lock()
	for _, g := range u.gates {
		select {
		case <-g:
		default:
			close(g)
		}
	}
	u.mu.Unlock()
	if err := u.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		u.srv.Close()
		return err
	}
	return nil
}
