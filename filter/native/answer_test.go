package main

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

// fakeResponse is a callout's answer as Envoy hands it over: headers and
// body, no trailers.
type fakeResponse struct {
	status  int
	headers map[string]string
	body    []byte
}

func (r *fakeResponse) Status() int { return r.status }

func (r *fakeResponse) Header(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r *fakeResponse) BodySize() int { return len(r.body) }

func (r *fakeResponse) AppendBody(dst []byte, limit int) ([]byte, bool) {
	if len(r.body) > limit {
		return append(dst, r.body[:limit]...), false
	}
	return append(dst, r.body...), true
}

// frame is msg in gRPC's framing.
func frame(msg string) []byte {
	b := []byte{0}
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

// TestReadAnswer: the rule for answers without trailers.
func TestReadAnswer(t *testing.T) {
	ok := &fakeResponse{status: 200, headers: map[string]string{"content-type": "application/grpc"}, body: frame("\x08\x01")}
	for _, tt := range []struct {
		name     string
		result   dynmod.CalloutResult
		r        *fakeResponse
		message  string // the message, when the answer is one
		failure  string // part of the failure, else
		timedOut bool
		refused  bool
	}{
		{name: "a message in a whole frame is OK", r: ok, message: "\x08\x01"},
		{name: "OK in the headers, then a message", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "0"}, body: frame("m")}, message: "m"},
		{name: "an empty message", r: &fakeResponse{status: 200, body: frame("")}, message: ""},
		{name: "UNAVAILABLE trailers-only", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "14", "grpc-message": "no redis"}},
			failure: "gRPC status 14: no redis"},
		{name: "RESOURCE_EXHAUSTED trailers-only", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "8", "grpc-message": "too many"}},
			failure: "gRPC status 8: too many"},
		{name: "DEADLINE_EXCEEDED is a timeout", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "4"}},
			failure: "gRPC status 4", timedOut: true},
		{name: "INVALID_ARGUMENT is refused", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "3"}},
			failure: "gRPC status 3", refused: true},
		{name: "an error status even with a body", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "13"}, body: frame("m")},
			failure: "gRPC status 13"},
		{name: "an invalid grpc-status", r: &fakeResponse{status: 200, headers: map[string]string{"grpc-status": "x"}}, failure: "invalid grpc-status"},
		{name: "Envoy's 504 is the call's timeout", r: &fakeResponse{status: 504, body: []byte("upstream request timeout")},
			failure: "504", timedOut: true},
		{name: "no healthy upstream", r: &fakeResponse{status: 503, body: []byte("no healthy upstream")}, failure: "HTTP status 503"},
		{name: "200 with neither message nor status: a status in the trailers", r: &fakeResponse{status: 200}, failure: "trailers"},
		{name: "a torn frame", r: &fakeResponse{status: 200, body: frame("message")[:7]}, failure: rlsproto.ErrFrameLength.Error()},
		{name: "a compressed frame", r: &fakeResponse{status: 200, body: append([]byte{1}, frame("m")[1:]...)}, failure: rlsproto.ErrCompressed.Error()},
		{name: "too large", r: &fakeResponse{status: 200, body: make([]byte, rlsproto.MaxAnswer+1)}, failure: "too large"},
		{name: "no answer", result: dynmod.CalloutReset, r: ok, failure: rlsproto.ReasonNoAnswer, timedOut: true},
		{name: "over Envoy's buffer", result: dynmod.CalloutBodyTooLarge, r: ok, failure: "too large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var body []byte
			a := readAnswer(tt.result, tt.r, &body)
			if tt.failure == "" {
				if a.Failure != "" || string(a.Message) != tt.message {
					t.Fatalf("answer %+v, want the message %q", a, tt.message)
				}
				return
			}
			if !strings.Contains(a.Failure, tt.failure) || a.TimedOut != tt.timedOut || a.Refused != tt.refused {
				t.Fatalf("answer %+v, want a failure with %q, timed out %v, refused %v", a, tt.failure, tt.timedOut, tt.refused)
			}
		})
	}
}
