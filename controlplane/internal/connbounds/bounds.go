package connbounds

import "time"

// Bounds are what one listener allows: how many connections, what each may
// hold, and how long each may wait. Zero fields take Default's (WithDefaults).
type Bounds struct {
	// MaxConns bounds the open connections. At the cap the listener closes
	// the connection without a call in flight that is due to close soonest
	// for want of calls, to take the new one.
	MaxConns int
	// MaxStreamsPerConn is a connection's concurrent streams (HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS).
	MaxStreamsPerConn uint32
	// MaxMsgBytes bounds one request message.
	MaxMsgBytes int
	// MaxHeaderBytes bounds one request's decoded headers; a header block
	// is at most twice as many encoded bytes (MaxHeaderBlock).
	MaxHeaderBytes uint32
	// MaxConnBufferBytes and MaxBufferBytes bound the request bytes
	// buffered for one connection and for all of them together (decision
	// port).
	MaxConnBufferBytes int64
	MaxBufferBytes     int64
	// HandshakeTimeout bounds a new connection's way to its first call:
	// the HTTP/2 preface and SETTINGS (and TLS).
	HandshakeTimeout time.Duration
	// FirstCallTimeout closes a connection that has completed no call
	// this long after it was accepted; it is at most IdleTimeout.
	FirstCallTimeout time.Duration
	// IdleTimeout closes a connection without calls for this long.
	IdleTimeout time.Duration
	// BodyTimeout resets a call whose request has not arrived this long
	// after its headers (decision port).
	BodyTimeout time.Duration
}

// Default are the bounds every listener starts from: the decision port's,
// whose flags (-max-conns and the rest) change them.
var Default = Bounds{
	// Envoy opens one connection per worker thread to each replica: 1024
	// serve well over a hundred Envoys, at about 52 KB each while idle.
	MaxConns: 1024,
	// A decision takes a millisecond or two: 100 in flight on one
	// connection carry 5,000 calls a second even at the 20 ms Redis
	// deadline, and Envoy and grpc-go queue calls beyond it.
	MaxStreamsPerConn: 100,
	// A ShouldRateLimit request is a few hundred bytes; 64 KiB still fits
	// the 256 descriptors -max-descriptors allows at about 250 bytes each.
	MaxMsgBytes:    64 << 10,
	MaxHeaderBytes: 16 << 10,
	// A connection holds at most 4 MiB of requests, the server 64 MiB,
	// shared fairly among the connections.
	MaxConnBufferBytes: 4 << 20,
	MaxBufferBytes:     64 << 20,
	HandshakeTimeout:   10 * time.Second,
	// A client connects to make a call and makes it within milliseconds;
	// one that has made none after 10 s holds a slot for nothing.
	FirstCallTimeout: 10 * time.Second,
	// Envoy keeps its connections busy: one idle for five minutes is a
	// client gone without closing.
	IdleTimeout: 5 * time.Minute,
	// Decision requests are sent with their headers; Envoy gives up on a
	// call after 20 ms. 2 s leaves room for a lost packet's retransmissions.
	BodyTimeout: 2 * time.Second,
}

// WithDefaults returns b with its zero (or negative) fields set to
// Default's, and FirstCallTimeout at most IdleTimeout.
func (b Bounds) WithDefaults() Bounds { return b.Or(Default) }

// Or returns b with its zero (or negative) fields set to d's, and
// FirstCallTimeout at most IdleTimeout.
func (b Bounds) Or(d Bounds) Bounds {
	b.MaxConns = orDefault(b.MaxConns, d.MaxConns)
	b.MaxStreamsPerConn = orDefault(b.MaxStreamsPerConn, d.MaxStreamsPerConn)
	b.MaxMsgBytes = orDefault(b.MaxMsgBytes, d.MaxMsgBytes)
	b.MaxHeaderBytes = orDefault(b.MaxHeaderBytes, d.MaxHeaderBytes)
	b.MaxConnBufferBytes = orDefault(b.MaxConnBufferBytes, d.MaxConnBufferBytes)
	b.MaxBufferBytes = orDefault(b.MaxBufferBytes, d.MaxBufferBytes)
	b.HandshakeTimeout = orDefault(b.HandshakeTimeout, d.HandshakeTimeout)
	b.IdleTimeout = orDefault(b.IdleTimeout, d.IdleTimeout)
	b.FirstCallTimeout = min(orDefault(b.FirstCallTimeout, d.FirstCallTimeout), b.IdleTimeout)
	b.BodyTimeout = orDefault(b.BodyTimeout, d.BodyTimeout)
	return b
}

// MaxHeaderBlock bounds one header block's encoded bytes, over all its
// CONTINUATION frames: twice MaxHeaderBytes (HPACK rarely makes a header
// list longer than it is).
func (b Bounds) MaxHeaderBlock() int { return 2 * int(b.MaxHeaderBytes) }

// The listeners that serve operators and scrapers, not the fleet (the
// policy service, the metrics and health HTTP listeners): few connections,
// few streams each.
const (
	OperatorMaxConns   = 64
	OperatorMaxStreams = 16 // Apply, Get, List, Delete and Watch
)

// Operator returns b for a listener of operators and scrapers: b's
// timeouts and header bound, OperatorMaxConns connections and
// OperatorMaxStreams streams each, messages of maxMsg bytes.
func (b Bounds) Operator(maxMsg int) Bounds {
	b = b.WithDefaults()
	b.MaxConns, b.MaxStreamsPerConn, b.MaxMsgBytes = OperatorMaxConns, OperatorMaxStreams, maxMsg
	return b
}

// RLQS bounds beyond Default: an Envoy holds one stream per
// rate_limit_quota filter configuration on its connection to a replica,
// and a report holds all of a stream's buckets (1,024 buckets of ids up to
// about 100 bytes in 128 KiB).
const (
	RLQSMaxStreams = 16
	RLQSMaxMsg     = 128 << 10
)

// RLQS returns b for the RLQS listener: b's connections and timeouts,
// RLQSMaxStreams streams a connection and messages of RLQSMaxMsg bytes.
func (b Bounds) RLQS() Bounds {
	b = b.WithDefaults()
	b.MaxStreamsPerConn, b.MaxMsgBytes = RLQSMaxStreams, RLQSMaxMsg
	return b
}

// What the HTTP/2 servers allow a connection in frames before they send
// GOAWAY ENHANCE_YOUR_CALM and close it: package grpcunary itself, the
// frame guard of package server in front of grpc-go.
const (
	// ResetWindow is the window of streams opened over which resets
	// (rapid reset) and refused streams count: past MaxEarlyResets of
	// them, or MaxSettings SETTINGS frames, in one window.
	ResetWindow    = 1024
	MaxEarlyResets = ResetWindow / 2
	MaxSettings    = 16
	// MaxContinuations bounds the CONTINUATION frames of one header block
	// (its bytes: MaxHeaderBlock).
	MaxContinuations = 16
	// MaxPings bounds the PING frames a client sends within PingWindow
	// without the server writing HEADERS or DATA in between: a keepalive
	// pings every few seconds at most, and flow-control (BDP) pings
	// follow the server's DATA.
	MaxPings   = 32
	PingWindow = time.Second
	// MaxQueuedCtrlFrames and MaxQueuedCtrlBytes bound the control frames
	// (PING and SETTINGS acknowledgements, RST_STREAM, WINDOW_UPDATE)
	// queued for a peer that does not read them.
	MaxQueuedCtrlFrames = 1024
	MaxQueuedCtrlBytes  = 16 << 10
)

// Keepalive: how often a client may ping (MinPingPeriod: more often is a
// flood, and the connection is closed), and, on the listeners whose
// streams last (the policy service's Watch, RLQS), how long a connection
// may be silent before the server pings it (KeepaliveTime) and how long
// the ping may go unanswered (KeepaliveTimeout).
const (
	MinPingPeriod    = 10 * time.Second
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// Workers is how many goroutines a decision server keeps to run calls: a
// call that finds them all busy gets one of its own. Workers keep their
// grown stacks, where a goroutine per call grows (copies) its stack on
// every call.
const Workers = 256

// orDefault returns v, or def when v is not positive.
func orDefault[T int | int64 | uint32 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
