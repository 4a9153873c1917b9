// Package grpcunary serves unary gRPC methods over cleartext HTTP/2 ("h2c"
// with prior knowledge, which is how Envoy's gRPC clients reach a rate limit
// service), and nothing else.
//
// It exists for the decision port. grpc-go's server spent about 22-26 µs of
// CPU per ShouldRateLimit call on the benchmark machine, more than the
// decision and the Redis round trip together: a stream goroutine, a
// control buffer, the loopy writer, per-call contexts, interceptors, stats
// handlers and per-call header maps are all paid on every call. A unary
// method needs a small part of that. Here a connection has one reader
// goroutine (frames in), one writer goroutine (frames out, flushed once per
// batch of ready answers) and one goroutine per call; response headers and
// the OK trailers are HPACK blocks computed once.
//
// What is implemented of HTTP/2 (RFC 9113), and what is not:
//   - the connection preface, SETTINGS (applied and acknowledged), PING,
//     GOAWAY both ways, RST_STREAM both ways, PRIORITY (ignored), unknown
//     frame types (ignored), HEADERS with CONTINUATION (x/net/http2's Framer
//     and HPACK decoder; the checks of decoded fields are headerDecoder's,
//     the Framer's own made without its allocations), DATA with padding;
//   - flow control in both directions: the receive windows are large and
//     replenished as data is consumed; answers wait for the peer's send
//     windows and are split at its MAX_FRAME_SIZE;
//   - MAX_CONCURRENT_STREAMS is advertised and enforced (REFUSED_STREAM);
//   - bounds on what a client can make the server hold: connections (at
//     the cap the idlest makes room), request bytes per connection and in
//     all (shared fairly), request bodies that do not end, idle
//     connections (sooner for those that never completed a call), the
//     handshake, control frames queued for a peer that does not read,
//     CONTINUATION frames, and streams reset before their call starts
//     (Options, and RATIONALE.md's "Bounds");
//   - the stream states of RFC 9113, 5.1: frames on idle streams are
//     connection errors, frames on closed streams stream errors
//     (STREAM_CLOSED), except on streams we reset lately, whose frames that
//     were in flight are ignored; frames above 16384 bytes (our
//     SETTINGS_MAX_FRAME_SIZE) are connection errors;
//   - a connection error sends GOAWAY, then a FIN, and waits (at most a
//     second) for the peer to close its side, so that the GOAWAY is not
//     lost to a TCP reset;
//   - no server push, no TLS (put the port on loopback or a private network,
//     or use the grpc-go server, which the control plane can still run), no
//     compression (a compressed request is answered UNIMPLEMENTED, as gRPC
//     does for an unknown grpc-encoding), no streaming methods.
//
// gRPC semantics: a call is POST with content-type application/grpc (or
// application/grpc+proto, ...) to /package.Service/Method; grpc-timeout
// becomes the handler's context deadline; a client's RST_STREAM or the
// connection's end cancels that context; the answer is one length-prefixed
// message followed by trailers, or a trailers-only answer for an error.
// Errors carry their grpc-status and a percent-encoded grpc-message (from
// google.golang.org/grpc/status).
package grpcunary
