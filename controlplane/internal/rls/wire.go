package rls

import (
	"context"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// arenas are the arenas of wire calls in progress and spare.
var arenas = sync.Pool{New: func() any { return new(arena) }}

// ShouldRateLimitWire is ShouldRateLimit on encoded messages, for a server
// that frames gRPC itself (package grpcunary): req is a RateLimitRequest's
// wire bytes, and the RateLimitResponse's are appended to dst. It decodes
// and encodes exactly as Codec does on a grpc-go server, with the request's
// messages in a pooled arena. A request that does not decode is refused
// with INTERNAL, as grpc-go refuses it.
func (s *Service) ShouldRateLimitWire(ctx context.Context, dst, req []byte) ([]byte, error) {
	a := arenas.Get().(*arena)
	defer func() {
		a.reset()
		arenas.Put(a)
	}()
	r, err := decodeWire(req, a)
	if err != nil {
		return nil, err
	}
	resp, err := s.ShouldRateLimit(ctx, r)
	if err != nil {
		return nil, err
	}
	return s.appendWire(dst, resp)
}

// decodeWire decodes a request's wire bytes into a, or, when the request
// is not of the shape decodeRequest takes, with protobuf-go into a new
// message. A request that does not decode (garbage bytes, a string of
// invalid UTF-8) is the client's error: InvalidArgument, as the grpc-go
// server answers it (see controlplane/internal/invalidarg).
func decodeWire(b []byte, a *arena) (*rlsv3.RateLimitRequest, error) {
	r := a.request()
	if decodeRequestIn(b, r, a) {
		return r, nil
	}
	r = new(rlsv3.RateLimitRequest)
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "rls: cannot decode the RateLimitRequest: %v", err)
	}
	return r, nil
}

// appendWire appends resp's wire bytes to dst, as Codec encodes it.
func (s *Service) appendWire(dst []byte, resp *rlsv3.RateLimitResponse) ([]byte, error) {
	if resp.DynamicMetadata == nil {
		return proto.MarshalOptions{}.MarshalAppend(dst, resp)
	}
	return appendResponse(dst, resp, &s.policies.Load().wire)
}

// WireCall is one call of ShouldRateLimitBatch.
type WireCall struct {
	Req    []byte   // the RateLimitRequest's wire bytes
	Settle []string // the call's x-sluice-settle values: nil but for a settlement (SettleHeader)
	Resp   []byte   // the RateLimitResponse's, appended by ShouldRateLimitBatch...
	Err    error    // ...or why the call failed, as a gRPC status error
}

// batch is the working storage of one ShouldRateLimitBatch.
type batch struct {
	arenas  []*arena
	pend    []pending
	ok      []bool // the call was prepared (pend holds it)
	checks  []store.Check
	results []algorithms.Result
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// ShouldRateLimitBatch is ShouldRateLimitWire for calls that arrived
// together: every call's checks go to the store in one Decide, so the
// calls share one wait for Redis instead of one each. Each call is answered
// as ShouldRateLimitWire would answer it alone; the store's failure (or
// its deadline) falls on all of them alike, each answered by its policies'
// failure modes. ctx bounds the store call; a call's own deadline is not
// applied (its client enforces it).
func (s *Service) ShouldRateLimitBatch(ctx context.Context, calls []WireCall) {
	start := time.Now()
	b := batches.Get().(*batch)
	n := len(calls)
	b.arenas = resize(b.arenas, n)
	b.pend, b.ok = resize(b.pend, n), resize(b.ok, n)
	b.checks = b.checks[:0]
	for i := range calls {
		c := &calls[i]
		a := arenas.Get().(*arena)
		b.arenas[i] = a
		r, err := decodeWire(c.Req, a)
		if err != nil {
			c.Err = err
			continue
		}
		p, err := s.prepare(r, c.Settle)
		if err == nil {
			err = s.takeTokens(ctx, &p)
		}
		if err != nil {
			c.Err = err
			continue
		}
		b.pend[i], b.ok[i] = p, true
		b.checks = append(b.checks, p.sc.checks...)
	}
	results := resize(b.results, len(b.checks))
	var storeErr error
	abandoned := false
	if len(b.checks) > 0 {
		storeErr = s.store.Decide(ctx, b.checks, results)
		abandoned = storeErr != nil && ctx.Err() != nil
	}
	off := 0
	for i := range calls {
		if !b.ok[i] {
			continue
		}
		c, p := &calls[i], &b.pend[i]
		k := len(p.sc.checks)
		switch {
		case abandoned:
			c.Err = status.FromContextError(ctx.Err()).Err()
		case storeErr != nil && p.onces != nil:
			p.dm.storeErrors.Inc()
			c.Err = errSettleUndecided
		default:
			if storeErr != nil {
				p.dm.storeErrors.Inc()
			}
			c.Resp, c.Err = s.appendWire(c.Resp, s.finish(p, results[off:off+k], storeErr))
		}
		off += k
		putScratch(p.sc)
	}
	if storeErr != nil && !abandoned {
		s.logStoreError(b.pend[firstOK(b.ok)].label, storeErr)
	}
	took := time.Since(start).Seconds()
	for i := range calls {
		s.metrics.Latency.Observe(took)
		if a := b.arenas[i]; a != nil {
			a.reset()
			arenas.Put(a)
		}
	}
	clear(b.arenas)
	clear(b.pend)
	clear(b.checks)
	b.checks = b.checks[:0]
	if !abandoned { // else the store may still write into results
		b.results = results
	} else {
		b.results = nil
	}
	batches.Put(b)
}

// firstOK returns the index of the first true in ok.
func firstOK(ok []bool) int {
	for i, v := range ok {
		if v {
			return i
		}
	}
	return 0
}
