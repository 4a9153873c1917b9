package main

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

// response is what readAnswer reads of a callout's answer
// (*dynmod.Response).
type response interface {
	Status() int
	Header(name string) (string, bool)
	BodySize() int
	AppendBody(dst []byte, limit int) ([]byte, bool)
}

// readAnswer turns a callout's answer into the core's form. Envoy's
// callout hands the module the answer's headers and body, never its
// trailers (HTTP/2 too), so a gRPC status sent as a trailer, the usual
// place of an OK, is not there to read. The rule, for a unary RLS call:
//
//   - no answer (result reset): the call failed or timed out, as a
//     proxy-wasm host reports a call that got no response;
//   - :status 504: Envoy's own answer when the call's timeout passes (it
//     reports the timeout as a success); a timeout;
//   - a grpc-status header: a trailers-only answer, the form a gRPC server
//     gives every error of a unary call (grpc-go among others); its status
//     decides, and any but OK is a failure, DEADLINE_EXCEEDED and Envoy's
//     UNAVAILABLE "timeout" counted as timeouts;
//   - else :status 200 with a body that is one whole uncompressed gRPC
//     frame: the response message, an OK (a unary server sends its message
//     only on success, then OK in the trailers);
//   - anything else (another :status, 200 with no body or a torn frame):
//     a failure.
//
// What the rule cannot see is a server that sends a message and then a
// status other than OK in the trailers, which the gRPC protocol allows but
// no unary server sluice talks to does (sluice-controlplane and
// envoyproxy/ratelimit end in error before any message). Envoy's streamed
// callout delivers trailers; it costs the module four hooks per call
// instead of one, for that case alone.
//
// body is scratch the message is read into; the Answer points into it.
func readAnswer(result dynmod.CalloutResult, r response, body *[]byte) rlsproto.Answer {
	switch result {
	case dynmod.CalloutSuccess:
	case dynmod.CalloutBodyTooLarge:
		return rlsproto.TooLarge(r.BodySize())
	default:
		return rlsproto.NoAnswer()
	}
	status := r.Status()
	if status == 504 {
		return rlsproto.Answer{Failure: "the control plane did not answer within the call's timeout (Envoy answered 504)", TimedOut: true}
	}
	if gs, ok := r.Header("grpc-status"); ok {
		code, ok := rlsproto.ParseGRPCStatus(gs)
		switch {
		case !ok:
			return rlsproto.Answer{Failure: "the control plane's answer has an invalid grpc-status " + strconv.Quote(gs)}
		case code != rlsproto.GRPCOK:
			msg, _ := r.Header("grpc-message")
			return rlsproto.GRPCFailure(uint32(code), msg)
		}
	}
	if status != 200 {
		return rlsproto.Answer{Failure: "the control plane answered HTTP status " + strconv.Itoa(status)}
	}
	size := r.BodySize()
	if size > rlsproto.MaxAnswer {
		return rlsproto.TooLarge(size)
	}
	if size == 0 {
		return rlsproto.Answer{Failure: "the control plane's answer has no message and no grpc-status in its headers (a status in the trailers cannot be read)"}
	}
	*body, _ = r.AppendBody((*body)[:0], rlsproto.MaxAnswer)
	msg, err := rlsproto.ParseFrame(*body)
	if err != nil {
		return rlsproto.Answer{Failure: err.Error()}
	}
	return rlsproto.Answer{Message: msg}
}
