package policyservice

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
)

// Defaults of Limits. An Apply of the largest document (1 MiB, a few
// thousand limits) allocates about 130 MiB while it is parsed, stored and
// loaded back; four received and one parsed at a time keep the policy
// service's work within about 150 MiB. Watchers share their messages, so a
// watcher costs little but its connection: the caps leave at least half of
// the policy listener's 64 connections to other calls.
const (
	DefaultMaxApplies        = 4
	DefaultMaxWatches        = 32
	DefaultMaxWatchesPerConn = 4
	DefaultWatchSendTimeout  = 10 * time.Second
)

// Limits bounds the work the clients of a Service can have in flight; zero
// fields take the defaults.
type Limits struct {
	// MaxApplies is the most Apply calls admitted at once, in all; more are
	// refused with RESOURCE_EXHAUSTED before their message is read (see
	// TapHandle). Admitted calls are then validated and stored one at a
	// time.
	MaxApplies int
	// MaxWatches and MaxWatchesPerConn are the most Watch streams open at
	// once, in all and on one connection; more are refused with
	// RESOURCE_EXHAUSTED.
	MaxWatches        int
	MaxWatchesPerConn int
	// WatchSendTimeout ends a Watch whose client has not taken the
	// previous message when the next is due, this long after it is sent
	// (RESOURCE_EXHAUSTED): a watcher must read.
	WatchSendTimeout time.Duration
}

// withDefaults returns l with the defaults in place of zero fields.
func (l Limits) withDefaults() Limits {
	if l.MaxApplies <= 0 {
		l.MaxApplies = DefaultMaxApplies
	}
	if l.MaxWatches <= 0 {
		l.MaxWatches = DefaultMaxWatches
	}
	if l.MaxWatchesPerConn <= 0 {
		l.MaxWatchesPerConn = DefaultMaxWatchesPerConn
	}
	if l.WatchSendTimeout <= 0 {
		l.WatchSendTimeout = DefaultWatchSendTimeout
	}
	return l
}

// gate counts the Apply and Watch calls admitted.
type gate struct {
	lim     Limits
	mu      sync.Mutex
	applies int
	watches int
	perConn map[string]int // Watch streams by the connection's peer address
}

// The methods the gate bounds.
var (
	applyMethod = "/" + sluicev1.PolicyService_ServiceDesc.ServiceName + "/Apply"
	watchMethod = "/" + sluicev1.PolicyService_ServiceDesc.ServiceName + "/Watch"
)

// TapHandle admits an Apply or Watch call within the Limits, or refuses it
// with RESOURCE_EXHAUSTED before its request is read; its slot is freed
// when the call ends. Other calls pass. Use it as (a step of) the server's
// grpc.InTapHandle, after authentication.
func (s *Service) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	release, err := s.gate.admit(ctx, info.FullMethodName)
	if err != nil {
		return ctx, err
	}
	if release != nil {
		context.AfterFunc(ctx, release)
	}
	return ctx, nil
}

// admit takes a slot for method, returning how to give it back (nil for
// methods without a bound).
func (g *gate) admit(ctx context.Context, method string) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch method {
	case applyMethod:
		if g.applies >= g.lim.MaxApplies {
			return nil, status.Errorf(codes.ResourceExhausted, "%d Apply calls are in progress, the most the policy service takes at once: retry shortly", g.applies)
		}
		g.applies++
		return func() {
			g.mu.Lock()
			g.applies--
			g.mu.Unlock()
		}, nil
	case watchMethod:
		conn := ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			conn = p.Addr.String()
		}
		switch {
		case g.watches >= g.lim.MaxWatches:
			return nil, status.Errorf(codes.ResourceExhausted, "%d Watch streams are open, the most the policy service keeps: retry later", g.watches)
		case g.perConn[conn] >= g.lim.MaxWatchesPerConn:
			return nil, status.Errorf(codes.ResourceExhausted, "this connection holds %d Watch streams, the most one may", g.perConn[conn])
		}
		g.watches++
		g.perConn[conn]++
		return func() {
			g.mu.Lock()
			g.watches--
			if g.perConn[conn]--; g.perConn[conn] == 0 {
				delete(g.perConn, conn)
			}
			g.mu.Unlock()
		}, nil
	}
	return nil, nil
}

// sendWithin sends m on stream, or gives up after d: a client that has not
// taken the previous message by then does not read, and the caller ends
// the stream (which ends the send left waiting, too).
func sendWithin(stream grpc.ServerStream, m any, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- stream.SendMsg(m) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return status.Errorf(codes.ResourceExhausted, "the watcher did not take the previous message within %v: a watcher must read its stream", d)
	}
}
