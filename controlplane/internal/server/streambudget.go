package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/controlplane/internal/fairshare"
)

// streamBudget admits the streams of a grpc-go server (its InTapHandle):
// the first stream of a connection always, the others from a shared budget
// by fair shares (package fairshare). A connection under its share that finds
// none free takes one from the connection that holds the most over its
// share, one of whose streams still waiting for its request is cancelled
// (preempted): so no connection keeps more than its share while others
// wait, whatever order they came in. Otherwise a stream over the budget
// gets RESOURCE_EXHAUSTED and its connection goes on. A stream's slot comes
// back when the stream ends, whichever way (grpc-go cancels every stream's
// context then).
//
// It also marks the calls on their connection (connAddr.begin and end: the
// listener evicts idle connections by them), and gives each admitted call
// bodyTimeout to deliver its request: a call whose request never ends is
// then reset (grpc-go ends a stream whose context ends) and the bytes it
// holds freed, where it would otherwise hold its stream until the idle
// timeout. requestArrived, an interceptor, ends that deadline.
type streamBudget struct {
	refused     atomic.Uint64 // streams refused, ever
	preempted   atomic.Uint64 // streams cancelled for another connection's, ever
	late        atomic.Uint64 // calls reset for want of their request, ever
	bodyTimeout time.Duration // 0: none
	now         func() time.Time
	// streaming says the calls are long-lived streams (RLQS): a
	// connection's activity is then its streams' messages (see
	// rlqsActivity), not its calls, which would keep it busy for good.
	streaming bool
	busy      error // refuses a stream over the budget

	mu      sync.Mutex
	total   int64                  // shared streams
	free    int64                  // shared streams left
	holders map[*connAddr]struct{} // connections holding shared streams
}

// newStreamBudget returns a budget of shared streams whose calls must
// deliver their request within bodyTimeout (0: no limit).
func newStreamBudget(shared int64, bodyTimeout time.Duration) *streamBudget {
	return &streamBudget{total: shared, free: shared, holders: map[*connAddr]struct{}{}, bodyTimeout: bodyTimeout, now: time.Now, busy: errBusy}
}

// errBusy refuses a stream over the budget.
var errBusy = status.Error(codes.ResourceExhausted,
	"sluice: too many calls in progress on this server (the decision port's -max-buffer-bytes); retry shortly or on another replica")

// Causes of the end of a call's context.
var (
	errBodyTimeout = errors.New("sluice: the request did not arrive within -request-body-timeout of its headers")
	errPreempted   = errors.New("sluice: the request had not arrived and its connection held more than its share of the server's streams")
)

// call is an admitted stream.
type call struct {
	ca     *connAddr
	cancel context.CancelCauseFunc
	timer  *time.Timer // the body deadline; nil: none
	// tookShared is whether the call took a shared stream, and shared
	// whether it holds it still (it loses it to preemption); pending is
	// whether its request has yet to arrive (it may be preempted). Under
	// streamBudget.mu.
	tookShared, shared, pending bool
}

// callKey keys a call in its stream's context.
type callKey struct{}

// admit is a tap.ServerInHandle.
func (b *streamBudget) admit(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ca := peerConn(ctx)
	if ca == nil { // not from a limitListener: the shared budget alone
		ca = &connAddr{}
		ca.guaranteed.Store(1)
	}
	ca.tapped.Add(1)
	cctx, cancel := context.WithCancelCause(ctx)
	c := &call{ca: ca, cancel: cancel}
	if !ca.guaranteed.CompareAndSwap(0, 1) && !b.take(c) {
		cancel(nil)
		if !b.streaming {
			ca.lastEnd.Store(b.now().UnixNano()) // the connection is in use
		}
		return nil, b.busy
	}
	if !b.streaming {
		ca.begin()
	}
	if b.bodyTimeout > 0 {
		c.timer = time.AfterFunc(b.bodyTimeout, func() {
			b.late.Add(1)
			cancel(errBodyTimeout)
		})
	}
	context.AfterFunc(ctx, func() {
		b.release(c)
		if !b.streaming {
			ca.end(b.now())
		}
	})
	return context.WithValue(cctx, callKey{}, c), nil
}

// take takes a shared stream for c, free or preempted, or counts a
// refusal.
func (b *streamBudget) take(c *call) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	ca := c.ca
	held, n := ca.held.Load(), int64(len(b.holders))
	if held == 0 {
		n++
	}
	switch {
	case fairshare.Fits(b.total, b.free, held, 1, int64(len(b.holders))):
		b.free--
	case held < fairshare.Share(b.total, n) && b.preempt(fairshare.Share(b.total, n)):
	default:
		b.refused.Add(1)
		return false
	}
	if ca.held.Add(1) == 1 {
		b.holders[ca] = struct{}{}
	}
	if ca.pending == nil {
		ca.pending = map[*call]struct{}{}
	}
	ca.pending[c] = struct{}{}
	c.tookShared, c.shared, c.pending = true, true, true
	return true
}

// preempt frees a shared stream for another connection: it cancels a call
// still waiting for its request on the connection that holds the most
// over each one's share s, and reports whether there was one. Under b.mu.
func (b *streamBudget) preempt(s int64) bool {
	var most *connAddr
	for ca := range b.holders {
		held := ca.held.Load()
		if held > s && len(ca.pending) > 0 && (most == nil || held > most.held.Load()) {
			most = ca
		}
	}
	if most == nil {
		return false
	}
	for c := range most.pending {
		b.drop(c)
		c.cancel(errPreempted)
		b.preempted.Add(1)
		return true
	}
	return false
}

// drop takes c's shared stream away from its connection (to free it or
// give it to another call). Under b.mu.
func (b *streamBudget) drop(c *call) {
	if c.pending {
		delete(c.ca.pending, c)
		c.pending = false
	}
	c.shared = false
	if c.ca.held.Add(-1) == 0 {
		delete(b.holders, c.ca)
	}
}

// release gives back what c holds, its stream having ended.
func (b *streamBudget) release(c *call) {
	if c.timer != nil {
		c.timer.Stop()
	}
	if !c.tookShared {
		c.ca.guaranteed.Store(0)
		return
	}
	b.mu.Lock()
	if c.shared {
		b.drop(c)
		b.free++
	}
	b.mu.Unlock()
}

// arrived ends c's body deadline: its request is in.
func (b *streamBudget) arrived(c *call) {
	if c.timer != nil {
		c.timer.Stop()
	}
	if !c.tookShared {
		return
	}
	b.mu.Lock()
	if c.pending {
		delete(c.ca.pending, c)
		c.pending = false
	}
	b.mu.Unlock()
}

// peerConn returns the connection counters of a call's peer, or nil.
func peerConn(ctx context.Context) *connAddr {
	if p, ok := peer.FromContext(ctx); ok {
		ca, _ := p.Addr.(*connAddr)
		return ca
	}
	return nil
}

// requestArrived is a unary interceptor: grpc-go runs it once the request
// has been read, so it ends the call's body deadline and its exposure to
// preemption.
func (b *streamBudget) requestArrived(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		b.arrived(c)
	}
	return handler(ctx, req)
}

// requestArrivedStream is requestArrived for streaming calls (the health
// service's Watch): the request is in at the first message received.
func (b *streamBudget) requestArrivedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if c, ok := ss.Context().Value(callKey{}).(*call); ok {
		var once sync.Once
		return handler(srv, &afterRecv{ServerStream: ss, f: func(error) { once.Do(func() { b.arrived(c) }) }})
	}
	return handler(srv, ss)
}

// afterRecv calls f with the result of each RecvMsg of its stream.
type afterRecv struct {
	grpc.ServerStream
	f func(error)
}

func (s *afterRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.f(err)
	return err
}
