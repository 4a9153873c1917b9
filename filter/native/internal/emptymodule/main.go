// Command emptymodule is the native floor of bench-envoy: an Envoy dynamic
// module in Go that does nothing of sluice's but what its configuration
// names, on the dynmod binding the native host is built on, so that what it
// costs Envoy is the floor of any Go module on that binding.
//
//   - {} : every request continues (setup 2ne: the Go runtime and the
//     binding's crossings alone).
//   - {"callout": "http"}: for every request, reads x-user, sends sluice's
//     RateLimitRequest to cluster "rls" (package floorcall: the request and
//     headers of setups 2h and 2g) with a 100 ms timeout, holds the request,
//     and resumes it on the answer, whatever it is (setup 2n, the callout
//     floor). With "read": true it also reads the answer's :status,
//     grpc-status and body, the least a filter must read to decide.
//   - {"reply": true}: answers every request 429 with the headers of a
//     precheck rejection and counts it (setup 2nr).
//
// bench-envoy builds it as:
//
//	go build -buildmode=c-shared -o libsluicefloor.so ./filter/native/internal/emptymodule
package main

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/sluicehq/sluice/bench/envoy/floorcall"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

func main() {}

func init() { dynmod.Register(newFloor) }

// floor is the module's configuration.
type floor struct {
	callout, read, reply bool
	rejected             dynmod.Counter
	headers              []dynmod.Header // the callout's
}

func newFloor(c *dynmod.Config, _ string, raw []byte) (dynmod.ConfigHandler, error) {
	var js struct {
		Callout string `json:"callout"`
		Read    bool   `json:"read"`
		Reply   bool   `json:"reply"`
	}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &js); err != nil {
			return nil, err
		}
	}
	f := &floor{callout: js.Callout == "http", read: js.Read, reply: js.Reply}
	for _, h := range floorcall.Headers {
		f.headers = append(f.headers, dynmod.Header{Name: h[0], Value: h[1]})
	}
	if f.reply {
		var err error
		if f.rejected, err = c.DefineCounter("floor.rejected"); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// NewStream returns the stream's handler, or none when the floor is empty.
func (f *floor) NewStream(s *dynmod.Stream) dynmod.StreamHandler {
	if !f.callout && !f.reply {
		return nil
	}
	return &stream{s: s, f: f}
}

// Destroy does nothing.
func (f *floor) Destroy() {}

// stream is one request.
type stream struct {
	dynmod.PassThrough
	s    *dynmod.Stream
	f    *floor
	body []byte
}

// replyHeaders are a precheck rejection's.
var replyHeaders = []dynmod.Header{
	{Name: "ratelimit-policy", Value: `"user";q=1;w=3600`},
	{Name: "ratelimit", Value: `"user";r=0;t=3599`},
	{Name: "retry-after", Value: "3599"},
	{Name: "content-type", Value: "text/plain"},
}

var replyBody = []byte("rate limited\n")

// RequestHeaders makes the floor's host calls.
func (h *stream) RequestHeaders(bool) dynmod.HeadersStatus {
	user, _ := h.s.Headers(dynmod.RequestHeaders).Append(make([]byte, 0, 32), "x-user")
	if h.f.reply {
		h.f.rejected.Add(1)
		h.s.SendReply(429, replyHeaders, replyBody, "sluice_precheck_over_limit")
		return dynmod.HeadersStop
	}
	h.body = floorcall.AppendRequest(h.body[:0], user, true)
	err := h.s.Callout(floorcall.Cluster, h.f.headers, h.body, floorcall.TimeoutMs*time.Millisecond, h.answered)
	if err != nil {
		return dynmod.HeadersContinue
	}
	return dynmod.HeadersStopAll
}

// answered resumes the request, having read the answer if asked.
func (h *stream) answered(r *dynmod.Response) {
	if h.f.read {
		r.Status()
		r.Header("grpc-status")
		h.body, _ = r.AppendBody(h.body[:0], 4096)
	}
	h.s.ContinueRequest()
}
