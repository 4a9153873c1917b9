package core

import (
	"github.com/sluicehq/sluice/filter/core/calls"
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/descriptors"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// callOut asks the control plane about the descriptors in w.descs (their
// precheck keys are in x.keys) and pauses the request until the answer.
// It is apart from RequestHeaders, which it would slow down: in
// filter.wasm, the more code and variables a function has, the more each
// of its branches costs.
func (w *Worker) callOut(x *Exchange, now int64) Action {
	descs := w.descs.Descriptors
	for i := range descs {
		x.costs = append(x.costs, int64(descs[i].HitsAddend))
		x.rateLimits = append(x.rateLimits, descs[i].RateLimit)
	}
	o := &w.out
	o.body = rlsproto.AppendRequestFrame(o.body[:0], w.cfg.Domain, descs, o.caller)
	id, err := o.send(x.stream, o.body, x, now)
	if err != nil {
		w.leases.unask(x) // nobody waits for a call that was not made
		// (a usage-based request failed open settles its whole usage)
		return w.fail(x, "cannot call the control plane (cluster "+w.cfg.Cluster+"): "+err.Error(), false)
	}
	x.state, x.callID, x.sentAt = statePending, id, now
	w.leases.ask(x)
	return Pause
}

// frameOf appends to dst the request frame of the call s asks, each
// descriptor rebuilt from its precheck key with its cost: for a call made
// after the request that built the descriptors (a renewal, a request that
// waited).
func (o *outbox) frameOf(dst []byte, s *sent) []byte {
	o.descs, o.entries = o.descs[:0], o.entries[:0]
	for i := range s.keyEnds {
		o.descs, o.entries, _ = descriptors.AppendParsed(o.descs, o.entries, bufString(s.key(i)), uint32(s.costs[i]))
	}
	return rlsproto.AppendRequestFrame(dst, o.cfg.Domain, o.descs, o.caller)
}

// outbox sends a worker's decision calls: what every one of them has in
// common, and the call table they go into.
type outbox struct {
	*env
	calls       *calls.Table
	headers     []byte // request headers of the decision calls, serialized
	grpcService []byte // transport "grpc": the GrpcService; nil for "http"
	timeoutMs   uint32
	caller      uint64 // how the filter names itself (rlsproto.QuotaField)
	// Scratch.
	call    Call
	body    []byte // a request frame
	descs   []descriptors.Descriptor
	entries []descriptors.Entry
}

// newOutbox returns the outbox of e's configuration, for a proxy named
// caller, into the call table t.
func newOutbox(e *env, t *calls.Table, caller uint64) outbox {
	cfg := e.cfg
	o := outbox{env: e, calls: t, timeoutMs: uint32(cfg.Timeout / config.Millisecond), caller: caller,
		headers: headermap.Append(nil, rlsproto.CallHeaders(cfg.Authority, cfg.Timeout))}
	if cfg.Transport == config.TransportGRPC {
		o.grpcService = rlsproto.AppendGRPCService(nil, cfg.Cluster, cfg.Authority)
	}
	return o
}

// send makes a decision call of frame (a RateLimitRequest in gRPC's
// framing) for stream from (nil: none) and records it in the call table
// with its handler.
func (o *outbox) send(from Stream, frame []byte, h calls.Handler, now int64) (uint32, error) {
	o.call = Call{Cluster: o.cfg.Cluster, Headers: o.headers, Frame: frame, GRPCService: o.grpcService, TimeoutMs: o.timeoutMs}
	id, err := o.host.Call(from, &o.call)
	o.call = Call{}
	if err != nil {
		return 0, err
	}
	o.calls.Add(id, h, now+o.cfg.Timeout+overdueGrace)
	return id, nil
}
