package plugin

import (
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// The answers of calls made over proxy_grpc_call (transport "grpc"): the
// proxy's gRPC client has checked the HTTP and gRPC statuses and unframed
// the message, so a successful call delivers only the RateLimitResponse,
// and a failed one only its gRPC status.

// OnGRPCReceive takes the control plane's answer to a call.
func (vm *VM) OnGRPCReceive(rootID, callID uint32, size int) {
	p := vm.root(rootID)
	if p == nil {
		return
	}
	if p.renew.owns(callID) {
		defer vm.recoverRoot("proxy_on_grpc_receive (lease renewal)")
		p.onRenewal(callID, p.readGRPCAnswer(size))
		return
	}
	s := p.answered(callID)
	if s == nil {
		return
	}
	vm.current = s
	var action uint32
	defer vm.recoverStream("proxy_on_grpc_receive", &action, true)
	p.beginAnswer(s)
	p.decide(s, p.readGRPCAnswer(size), false)
	vm.current = nil
	p.called(s)
	vm.release(s)
}

// OnGRPCClose applies the failure mode to a call that failed.
func (vm *VM) OnGRPCClose(rootID, callID, status uint32) {
	p := vm.root(rootID)
	if p == nil {
		return
	}
	if p.renew.owns(callID) {
		defer vm.recoverRoot("proxy_on_grpc_close (lease renewal)")
		_, msg := p.host.GRPCStatus()
		p.onRenewal(callID, "the control plane answered gRPC status "+strconv.FormatUint(uint64(status), 10)+": "+msg)
		return
	}
	s := p.answered(callID)
	if s == nil {
		return
	}
	vm.current = s
	var action uint32
	defer vm.recoverStream("proxy_on_grpc_close", &action, true)
	p.beginAnswer(s)
	_, msg := p.host.GRPCStatus()
	// A call past its timeout ends DEADLINE_EXCEEDED, or UNAVAILABLE with
	// Envoy's "upstream request timeout", as over proxy_http_call.
	timedOut := status == rlsproto.GRPCDeadlineExceeded || (status == rlsproto.GRPCUnavailable && strings.Contains(msg, "timeout"))
	p.decide(s, "the control plane answered gRPC status "+strconv.FormatUint(uint64(status), 10)+": "+msg, timedOut)
	vm.current = nil
	p.called(s)
	vm.release(s)
}

// readGRPCAnswer decodes the response message into p.resp; it returns why
// the answer is unusable, or "".
func (p *Plugin) readGRPCAnswer(size int) string {
	if size > maxAnswer {
		return "the control plane's answer is too large (" + strconv.Itoa(size) + " bytes)"
	}
	msg, err := p.host.GRPCMessage(size)
	if err != nil {
		return "cannot read the control plane's answer: " + err.Error()
	}
	if err := rlsproto.Decode(msg, &p.resp); err != nil {
		return err.Error()
	}
	return ""
}
