package rlsproto

import (
	"strconv"
	"strings"
)

// MaxAnswer bounds the control plane's answer (the RateLimitResponse, or
// its gRPC frame): a longer one is not read.
const MaxAnswer = 1 << 20

// GRPCInvalidArgument is the gRPC status of a request the control plane
// refuses as malformed (a settlement that breaks the contract).
const GRPCInvalidArgument = 3

// ReasonNoAnswer is why a call failed when the proxy gave no answer: the
// call timed out (its timeout) or its connection failed.
const ReasonNoAnswer = "no answer from the control plane (timeout or connection failure)"

// Answer is the control plane's answer to a call in the one form the filter
// takes it, whichever transport carried it: a host turns an HTTP call's
// response (ReadHTTPAnswer) or a gRPC call's message or status
// (GRPCMessage, GRPCFailure) into an Answer before the filter's core sees
// it.
type Answer struct {
	// Message is the RateLimitResponse, unframed, when Failure is "": valid
	// until the callback that delivers it returns.
	Message []byte
	// Failure says why there is no usable answer ("" when Message holds it).
	Failure string
	// TimedOut says that the call failed by its timeout: no answer at all,
	// DEADLINE_EXCEEDED, or the UNAVAILABLE "upstream request timeout"
	// that Envoy itself answers when the call's timeout passes.
	TimedOut bool
	// Refused says that the control plane refused the request as
	// malformed (gRPC INVALID_ARGUMENT): sending it again cannot help.
	Refused bool
}

// NoAnswer is the Answer of a call that got no response at all (its timeout
// passed, or its connection failed).
func NoAnswer() Answer { return Answer{Failure: ReasonNoAnswer, TimedOut: true} }

// HTTPResponse is the response of a call made over HTTP (gRPC's framing on
// HTTP/2), read lazily: each read may cost the host a call.
type HTTPResponse interface {
	// Header returns a response header.
	Header(name string) (string, bool)
	// Trailer returns a response trailer.
	Trailer(name string) (string, bool)
	// Body returns the response body, of size bytes.
	Body(size int) ([]byte, error)
}

// ReadHTTPAnswer reads the response of a call made over HTTP whose body is
// bodySize bytes. A gRPC OK in the trailers is the common answer, and its
// :status is then not read (a host call fewer): a gRPC server sends
// trailers after a 200 and a message, and a body that does not decode as
// the answer fails later anyway.
func ReadHTTPAnswer(r HTTPResponse, bodySize int) Answer {
	gs, ok := r.Trailer("grpc-status")
	if ok && gs == "0" {
		return readHTTPBody(r, bodySize)
	}
	if status, _ := r.Header(":status"); status != "200" {
		return Answer{Failure: "the control plane answered HTTP status " + strconv.Quote(status)}
	}
	if !ok {
		gs, ok = r.Header("grpc-status") // a trailers-only answer
	}
	if !ok {
		return Answer{Failure: "the control plane's answer has no grpc-status"}
	}
	code, ok := ParseGRPCStatus(gs)
	if !ok {
		return Answer{Failure: "the control plane's answer has an invalid grpc-status " + strconv.Quote(gs)}
	}
	if code != GRPCOK {
		msg, ok := r.Trailer("grpc-message")
		if !ok {
			msg, _ = r.Header("grpc-message")
		}
		return statusAnswer(gs, code, msg)
	}
	return readHTTPBody(r, bodySize)
}

// readHTTPBody reads the body of a gRPC OK answer and unframes its message.
func readHTTPBody(r HTTPResponse, bodySize int) Answer {
	if bodySize > MaxAnswer {
		return TooLarge(bodySize)
	}
	body, err := r.Body(bodySize)
	if err != nil {
		return Answer{Failure: "cannot read the control plane's answer: " + err.Error()}
	}
	msg, err := ParseFrame(body)
	if err != nil {
		return Answer{Failure: err.Error()}
	}
	return Answer{Message: msg}
}

// GRPCMessage returns the Answer of a gRPC call whose response message msg
// the host read (err: it could not). A message over MaxAnswer is not read:
// its Answer is TooLarge.
func GRPCMessage(msg []byte, err error) Answer {
	if err != nil {
		return Answer{Failure: "cannot read the control plane's answer: " + err.Error()}
	}
	return Answer{Message: msg}
}

// GRPCFailure returns the Answer of a gRPC call that ended with status code
// (not OK) and message msg.
func GRPCFailure(code uint32, msg string) Answer {
	return statusAnswer(strconv.FormatUint(uint64(code), 10), int(code), msg)
}

// statusAnswer is the failure of a call the control plane answered with gRPC
// status code (gs as written), message msg. A call past its timeout ends
// DEADLINE_EXCEEDED, or UNAVAILABLE with Envoy's "upstream request timeout".
func statusAnswer(gs string, code int, msg string) Answer {
	return Answer{
		Failure:  "the control plane answered gRPC status " + gs + ": " + msg,
		TimedOut: code == GRPCDeadlineExceeded || (code == GRPCUnavailable && strings.Contains(msg, "timeout")),
		Refused:  code == GRPCInvalidArgument,
	}
}

// TooLarge returns the Answer of a call whose response is size bytes, over
// MaxAnswer: it is not read.
func TooLarge(size int) Answer {
	return Answer{Failure: "the control plane's answer is too large (" + strconv.Itoa(size) + " bytes)"}
}
