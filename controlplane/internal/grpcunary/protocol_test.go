package grpcunary

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// The tests here drive the server frame by frame with x/net's Framer over a
// loopback connection, so that every frame the server sends, and every
// frame it must refuse, can be checked against RFC 9113.

const frameWait = 5 * time.Second // how long a test waits for a frame that must come

// rawClient is a hand-driven HTTP/2 client connection.
type rawClient struct {
	t        *testing.T
	nc       net.Conn
	fr       *http2.Framer
	enc      *hpack.Encoder
	encBuf   bytes.Buffer
	dec      *hpack.Decoder
	settings map[http2.SettingID]uint32 // the server's SETTINGS
}

// dialRaw connects to addr and writes the client preface, but no SETTINGS.
func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc), dec: hpack.NewDecoder(4096, nil), settings: map[http2.SettingID]uint32{}}
	c.fr.AllowIllegalWrites = true // some tests send what a client must not
	c.enc = hpack.NewEncoder(&c.encBuf)
	if _, err := io.WriteString(nc, clientPreface); err != nil {
		t.Fatal(err)
	}
	return c
}

// dial connects to addr, sends SETTINGS with settings and waits until the
// server has sent its SETTINGS and acknowledged ours.
func dial(t *testing.T, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	c := dialRaw(t, addr)
	if err := c.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	var sawSettings, sawAck bool
	for !sawSettings || !sawAck {
		switch f := c.read().(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				sawAck = true
				continue
			}
			sawSettings = true
			f.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
			if err := c.fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		case *http2.WindowUpdateFrame:
		default:
			t.Fatalf("handshake: unexpected %v", f.Header())
		}
	}
	return c
}

// read returns the next frame, failing the test if none comes in time.
func (c *rawClient) read() http2.Frame {
	c.t.Helper()
	f, err := c.readErr()
	if err != nil {
		c.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

func (c *rawClient) readErr() (http2.Frame, error) {
	c.nc.SetReadDeadline(time.Now().Add(frameWait))
	return c.fr.ReadFrame()
}

// next returns the next frame other than a WINDOW_UPDATE (the server
// returns the window as it likes).
func (c *rawClient) next() http2.Frame {
	c.t.Helper()
	for {
		f := c.read()
		if _, ok := f.(*http2.WindowUpdateFrame); !ok {
			return f
		}
	}
}

// block HPACK-encodes fields.
func (c *rawClient) block(fields []hpack.HeaderField) []byte {
	c.encBuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			c.t.Fatal(err)
		}
	}
	return bytes.Clone(c.encBuf.Bytes())
}

func (c *rawClient) headers(id uint32, end bool, fields []hpack.HeaderField) {
	c.t.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block(fields), EndStream: end, EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
}

// data sends b on stream id in DATA frames of the default maximum size.
func (c *rawClient) data(id uint32, end bool, b []byte) {
	c.t.Helper()
	for {
		n := min(len(b), defaultFrameSize)
		if err := c.fr.WriteData(id, end && n == len(b), b[:n]); err != nil {
			c.t.Fatal(err)
		}
		if b = b[n:]; len(b) == 0 {
			return
		}
	}
}

// call sends a whole unary call: HEADERS and one DATA with body.
func (c *rawClient) call(id uint32, path string, body []byte) {
	c.t.Helper()
	c.headers(id, false, request(path))
	c.data(id, true, body)
}

// decode decodes a header block into "name: value" fields.
func (c *rawClient) decode(b []byte) map[string]string {
	c.t.Helper()
	fields, err := c.dec.DecodeFull(b)
	if err != nil {
		c.t.Fatalf("decoding %x: %v", b, err)
	}
	m := map[string]string{}
	for _, f := range fields {
		m[f.Name] = f.Value
	}
	return m
}

// pingPong sends a PING and checks that the next frame (window updates
// aside) is its ACK: nothing the server had to send before it is missing.
func (c *rawClient) pingPong() {
	c.t.Helper()
	data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	if err := c.fr.WritePing(false, data); err != nil {
		c.t.Fatal(err)
	}
	f, ok := c.next().(*http2.PingFrame)
	if !ok || !f.IsAck() || f.Data != data {
		c.t.Fatalf("want a PING ACK, got %v", f)
	}
}

// expectGoAway reads until a GOAWAY, which must carry code, and then
// expects the connection to be closed (not reset).
func (c *rawClient) expectGoAway(code http2.ErrCode) *http2.GoAwayFrame {
	c.t.Helper()
	for {
		f := c.read()
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != code {
				c.t.Fatalf("GOAWAY %v, want %v", g.ErrCode, code)
			}
			last := g.LastStreamID
			c.expectClosed()
			return &http2.GoAwayFrame{LastStreamID: last, ErrCode: code}
		}
		switch f.(type) {
		case *http2.WindowUpdateFrame, *http2.SettingsFrame:
		default:
			c.t.Fatalf("want GOAWAY %v, got %v", code, f.Header())
		}
	}
}

// expectClosed reads until the end of the connection, which must be an
// orderly one (FIN, not RST: a reset can destroy the frames before it).
func (c *rawClient) expectClosed() {
	c.t.Helper()
	for {
		_, err := c.readErr()
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			c.t.Fatalf("the connection ended with %v, want EOF", err)
		}
		return
	}
}

// expectRST reads until a RST_STREAM, which must be on id with code.
func (c *rawClient) expectRST(id uint32, code http2.ErrCode) {
	c.t.Helper()
	f, ok := c.next().(*http2.RSTStreamFrame)
	if !ok || f.StreamID != id || f.ErrCode != code {
		c.t.Fatalf("want RST_STREAM %d %v, got %v", id, code, f)
	}
}

// answer is what the server sent on one stream.
type answer struct {
	headers  map[string]string // the first header block
	trailers map[string]string // the second, if any
	data     []byte
	frames   []int // the length of each DATA frame
}

// readAnswer reads stream id's answer, up to its END_STREAM; other frames
// fail the test.
func (c *rawClient) readAnswer(id uint32) answer {
	c.t.Helper()
	var a answer
	for {
		f := c.next()
		if f.Header().StreamID != id {
			c.t.Fatalf("want stream %d's answer, got %v", id, f.Header())
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if !f.HeadersEnded() {
				c.t.Fatal("a header block in more than one frame")
			}
			fields := c.decode(f.HeaderBlockFragment())
			if a.headers == nil {
				a.headers = fields
			} else {
				a.trailers = fields
			}
		case *http2.DataFrame:
			a.data = append(a.data, f.Data()...)
			a.frames = append(a.frames, len(f.Data()))
		default:
			c.t.Fatalf("stream %d: unexpected %v", id, f.Header())
		}
		if f.Header().Flags.Has(http2.FlagDataEndStream) {
			return a
		}
	}
}

// status is the grpc-status of an answer (of the trailers, or of a
// trailers-only answer).
func (a answer) status() string {
	if a.trailers != nil {
		return a.trailers["grpc-status"]
	}
	return a.headers["grpc-status"]
}

// request is the header list of a gRPC call of path.
func request(path string) []hpack.HeaderField {
	return []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path},
		{Name: ":authority", Value: "localhost"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
}

// with returns fields with name set to value (added if absent).
func with(fields []hpack.HeaderField, name, value string) []hpack.HeaderField {
	for i := range fields {
		if fields[i].Name == name {
			fields[i].Value = value
			return fields
		}
	}
	return append(fields, hpack.HeaderField{Name: name, Value: value})
}

// message frames a gRPC message.
func message(flags byte, b []byte) []byte {
	m := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(m[1:], uint32(len(b)))
	return append(m, b...)
}

// echoBody is the request body of an Echo call of b.
func echoBody(t *testing.T, b []byte) []byte {
	t.Helper()
	m, err := proto.Marshal(wrapperspb.Bytes(b))
	if err != nil {
		t.Fatal(err)
	}
	return message(0, m)
}

func TestPrefaceAndSettings(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxStreamsPerConn: 7}})
	c := dial(t, tb.addr)
	if c.settings[http2.SettingMaxConcurrentStreams] != 7 {
		t.Errorf("MAX_CONCURRENT_STREAMS %d, want 7", c.settings[http2.SettingMaxConcurrentStreams])
	}
	// A later SETTINGS is acknowledged too.
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000}); err != nil {
		t.Fatal(err)
	}
	if f, ok := c.next().(*http2.SettingsFrame); !ok || !f.IsAck() {
		t.Fatalf("want a SETTINGS ACK, got %v", f)
	}
	c.pingPong()
}

func TestBadPrefaceClosesConnection(t *testing.T) {
	tb := newTestbed(t, Options{})
	nc, err := net.Dial("tcp", tb.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	if _, err := io.WriteString(nc, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
}

func TestFirstFrameMustBeSettings(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dialRaw(t, tb.addr)
	if err := c.fr.WritePing(false, [8]byte{}); err != nil {
		t.Fatal(err)
	}
	c.expectGoAway(http2.ErrCodeProtocol)
}

func TestPing(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	c.pingPong()
	// A PING ACK is not answered.
	if err := c.fr.WritePing(true, [8]byte{9}); err != nil {
		t.Fatal(err)
	}
	c.pingPong()
}

// TestConnectionErrors checks frames that RFC 9113 makes connection
// errors: each is answered GOAWAY and the end of the connection.
func TestConnectionErrors(t *testing.T) {
	tb := newTestbed(t, Options{})
	for _, tc := range []struct {
		name string
		send func(c *rawClient)
		code http2.ErrCode
		last uint32 // the GOAWAY's last stream id
	}{
		{"even stream id", func(c *rawClient) { c.headers(2, true, request("/test.Echo/Echo")) }, http2.ErrCodeProtocol, 0},
		{"stream id lower than a previous one", func(c *rawClient) {
			c.call(5, "/test.Echo/Echo", echoBody(t, nil))
			c.readAnswer(5)
			c.headers(3, true, request("/test.Echo/Echo"))
		}, http2.ErrCodeProtocol, 5},
		{"HEADERS on a closed stream", func(c *rawClient) {
			c.call(1, "/test.Echo/Echo", echoBody(t, nil))
			c.readAnswer(1)
			c.headers(1, true, request("/test.Echo/Echo"))
		}, http2.ErrCodeProtocol, 1},
		{"DATA on an idle stream", func(c *rawClient) { c.data(1, true, echoBody(t, nil)) }, http2.ErrCodeProtocol, 0},
		{"DATA on stream 0", func(c *rawClient) { c.fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x")) }, http2.ErrCodeProtocol, 0},
		{"RST_STREAM on an idle stream", func(c *rawClient) { c.fr.WriteRSTStream(3, http2.ErrCodeCancel) }, http2.ErrCodeProtocol, 0},
		{"WINDOW_UPDATE on an idle stream", func(c *rawClient) { c.fr.WriteWindowUpdate(3, 10) }, http2.ErrCodeProtocol, 0},
		{"WINDOW_UPDATE of 0 on the connection", func(c *rawClient) { c.fr.WriteWindowUpdate(0, 0) }, http2.ErrCodeProtocol, 0},
		{"WINDOW_UPDATE of 0 on an idle stream", func(c *rawClient) { c.fr.WriteWindowUpdate(1, 0) }, http2.ErrCodeProtocol, 0},
		{"connection window above 2^31-1", func(c *rawClient) { c.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl, 0},
		{"frame larger than SETTINGS_MAX_FRAME_SIZE", func(c *rawClient) {
			c.headers(1, false, request("/test.Echo/Echo"))
			c.fr.WriteData(1, true, make([]byte, defaultFrameSize+1))
		}, http2.ErrCodeFrameSize, 1},
		{"HEADERS depending on itself", func(c *rawClient) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(request("/test.Echo/Echo")),
				EndHeaders: true, Priority: http2.PriorityParam{StreamDep: 1, Weight: 10}})
		}, http2.ErrCodeProtocol, 0},
		{"PRIORITY depending on itself", func(c *rawClient) {
			c.fr.WritePriority(3, http2.PriorityParam{StreamDep: 3, Weight: 10})
		}, http2.ErrCodeProtocol, 0},
		{"PUSH_PROMISE", func(c *rawClient) {
			c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: c.block(request("/")), EndHeaders: true})
		}, http2.ErrCodeProtocol, 0},
		{"SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1", func(c *rawClient) {
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
		}, http2.ErrCodeFlowControl, 0},
		{"CONTINUATION without HEADERS", func(c *rawClient) {
			c.fr.WriteContinuation(1, true, c.block(request("/")))
		}, http2.ErrCodeProtocol, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, tb.addr)
			c.t = t
			tc.send(c)
			if g := c.expectGoAway(tc.code); g.LastStreamID != tc.last {
				t.Errorf("GOAWAY's last stream %d, want %d", g.LastStreamID, tc.last)
			}
		})
	}
}

// TestStreamErrors checks requests that RFC 9113 makes stream errors: the
// stream is reset, and the connection goes on.
func TestStreamErrors(t *testing.T) {
	tb := newTestbed(t, Options{})
	echo := "/test.Echo/Echo"
	for _, tc := range []struct {
		name string
		send func(c *rawClient)
		code http2.ErrCode
	}{
		{"connection-specific header", func(c *rawClient) {
			c.headers(1, false, with(request(echo), "connection", "x"))
		}, http2.ErrCodeProtocol},
		{"te other than trailers", func(c *rawClient) { c.headers(1, false, with(request(echo), "te", "gzip")) }, http2.ErrCodeProtocol},
		{"missing pseudo-headers", func(c *rawClient) { c.headers(1, false, request(echo)[:1]) }, http2.ErrCodeProtocol},
		{"uppercase header name", func(c *rawClient) { c.headers(1, false, with(request(echo), "X-Up", "1")) }, http2.ErrCodeProtocol},
		{"content-length larger than the body", func(c *rawClient) {
			body := echoBody(t, []byte("abc"))
			c.headers(1, false, with(request(echo), "content-length", strconv.Itoa(len(body)+1)))
			c.data(1, true, body)
		}, http2.ErrCodeProtocol},
		{"content-length smaller than the body", func(c *rawClient) {
			body := echoBody(t, []byte("abc"))
			c.headers(1, false, with(request(echo), "content-length", strconv.Itoa(len(body)-1)))
			c.data(1, false, body)
		}, http2.ErrCodeProtocol},
		{"malformed content-length", func(c *rawClient) { c.headers(1, false, with(request(echo), "content-length", "-1")) }, http2.ErrCodeProtocol},
		{"trailers without END_STREAM", func(c *rawClient) {
			c.headers(1, false, request(echo))
			c.headers(1, false, []hpack.HeaderField{{Name: "x-trailer", Value: "1"}})
		}, http2.ErrCodeProtocol},
		{"pseudo-header in trailers", func(c *rawClient) {
			c.headers(1, false, request(echo))
			c.data(1, false, echoBody(t, nil))
			c.headers(1, true, []hpack.HeaderField{{Name: ":path", Value: "/"}})
		}, http2.ErrCodeProtocol},
		{"WINDOW_UPDATE of 0 on an open stream", func(c *rawClient) {
			c.headers(1, false, request(echo))
			c.fr.WriteWindowUpdate(1, 0)
		}, http2.ErrCodeProtocol},
		{"DATA after END_STREAM", func(c *rawClient) {
			c.call(1, echo, echoBody(t, nil))
			c.readAnswer(1)
			c.data(1, true, []byte("late"))
		}, http2.ErrCodeStreamClosed},
		{"DATA after RST_STREAM", func(c *rawClient) {
			c.headers(1, false, request(echo))
			c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			c.data(1, true, echoBody(t, nil))
		}, http2.ErrCodeStreamClosed},
		{"stream window above 2^31-1", func(c *rawClient) {
			c.headers(1, false, request(echo))
			c.fr.WriteWindowUpdate(1, 1<<31-1)
		}, http2.ErrCodeFlowControl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, tb.addr)
			c.t = t
			tc.send(c)
			c.expectRST(1, tc.code)
			c.pingPong()
			// The connection still serves calls.
			c.call(101, echo, echoBody(t, []byte("after")))
			if a := c.readAnswer(101); a.status() != "0" {
				t.Fatalf("a call after the stream error: %v", a)
			}
		})
	}
}

// TestCallErrors checks requests that are answered, with an HTTP status
// or a gRPC status, rather than reset.
func TestCallErrors(t *testing.T) {
	tb := newTestbed(t, Options{})
	echo := "/test.Echo/Echo"
	twoMessages := append(echoBody(t, []byte("a")), echoBody(t, []byte("b"))...)
	// A request decided by its headers ends with them (else the answer can
	// come before the end of the request, and a RST_STREAM after it).
	for _, tc := range []struct {
		name       string
		fields     []hpack.HeaderField
		body       [][]byte // DATA frames; none: END_STREAM on HEADERS
		padded     bool     // send body[0] with padding
		httpStatus string
		grpcStatus string
	}{
		{"GET", with(request(echo), ":method", "GET"), nil, false, "405", "12"},
		{"not gRPC", with(request(echo), "content-type", "application/json"), nil, false, "415", "12"},
		{"no content-type", request(echo)[:4], nil, false, "415", "12"},
		{"unknown method", request("/test.Echo/Nope"), nil, false, "200", "12"},
		{"grpc-encoding", with(request(echo), "grpc-encoding", "gzip"), nil, false, "200", "12"},
		{"malformed grpc-timeout", with(request(echo), "grpc-timeout", "1x"), nil, false, "200", "13"},
		{"compressed message", request(echo), [][]byte{message(1, []byte{1, 2})}, false, "200", "12"},
		{"bad message flags", request(echo), [][]byte{message(2, nil)}, false, "200", "13"},
		{"two messages", request(echo), [][]byte{twoMessages}, false, "200", "13"},
		{"two messages in two frames", request(echo), [][]byte{echoBody(t, []byte("a")), echoBody(t, []byte("b"))}, false, "200", "13"},
		{"prefix longer than the body", request(echo), [][]byte{echoBody(t, []byte("abc"))[:6]}, false, "200", "13"},
		{"short prefix", request(echo), [][]byte{{0, 0, 0}}, false, "200", "13"},
		{"no message", request(echo), nil, false, "200", "13"},
		{"empty DATA", request(echo), [][]byte{{}}, false, "200", "13"},
		{"handler error", request("/test.Echo/Fail"), [][]byte{message(0, nil)}, false, "200", "7"},
		{"padded DATA", request(echo), [][]byte{echoBody(t, []byte("p"))}, true, "200", "0"},
		{"content-length", with(request(echo), "content-length", "10"), [][]byte{echoBody(t, []byte("abc"))}, false, "200", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, tb.addr)
			c.t = t
			c.headers(1, len(tc.body) == 0, tc.fields)
			for i, b := range tc.body {
				end := i == len(tc.body)-1
				if tc.padded {
					if err := c.fr.WriteDataPadded(1, end, b, make([]byte, 200)); err != nil {
						t.Fatal(err)
					}
					continue
				}
				c.data(1, end, b)
			}
			a := c.readAnswer(1)
			if a.headers[":status"] != tc.httpStatus || a.status() != tc.grpcStatus {
				t.Fatalf(":status %s grpc-status %s (%v %v), want %s %s", a.headers[":status"], a.status(), a.headers, a.trailers, tc.httpStatus, tc.grpcStatus)
			}
			if tc.grpcStatus != "0" && (a.trailers != nil || len(a.data) != 0) {
				t.Fatalf("an error answer must be trailers-only: %v", a)
			}
			// The client had ended its side: no RST_STREAM follows.
			c.pingPong()
		})
	}
}

// TestHeaderAnswerWaitsForRequestEnd checks that an answer decided by the
// request's headers (an unknown method) leaves once the request has ended,
// and is not followed by RST_STREAM. An answer before the end needs a
// RST_STREAM NO_ERROR after it, which curl 7.88 took for a failed call
// (error 92) in 14 calls of 100.
func TestHeaderAnswerWaitsForRequestEnd(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	c.headers(1, false, request("/test.Echo/Nope"))
	c.pingPong() // no answer yet: the request goes on
	c.data(1, false, echoBody(t, []byte("ignored")))
	c.pingPong()
	c.data(1, true, nil)
	a := c.readAnswer(1)
	if a.status() != "12" || a.trailers != nil {
		t.Fatalf("got %v", a)
	}
	c.pingPong() // and no RST_STREAM after it
}

// TestRefusalResetsUnfinishedRequest checks that a request refused while
// it is still being received is answered at once and then reset with
// RST_STREAM NO_ERROR (RFC 9113, 8.1), and that the rest of the request
// is ignored.
func TestRefusalResetsUnfinishedRequest(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxMsgBytes: 1000}})
	c := dial(t, tb.addr)
	c.headers(1, false, request("/test.Echo/Echo"))
	c.data(1, false, echoBody(t, make([]byte, 5000))[:100])
	a := c.readAnswer(1)
	if a.status() != "8" || a.trailers != nil {
		t.Fatalf("got %v", a)
	}
	c.expectRST(1, http2.ErrCodeNo)
	c.data(1, true, make([]byte, 100)) // in flight when the RST_STREAM left: ignored
	c.pingPong()
}

func TestConcurrentStreamsLimit(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxStreamsPerConn: 2}})
	c := dial(t, tb.addr)
	c.call(1, "/test.Echo/Wait", message(0, nil))
	c.call(3, "/test.Echo/Wait", message(0, nil))
	<-tb.started
	<-tb.started
	c.call(5, "/test.Echo/Wait", message(0, nil))
	c.expectRST(5, http2.ErrCodeRefusedStream)
	c.pingPong() // stream 5's DATA, sent after its HEADERS, is ignored
	close(tb.release)
	got := map[uint32]bool{}
	for range 2 * 3 { // the two answers may come interleaved; each is three frames
		f := c.next()
		if h, ok := f.(*http2.HeadersFrame); ok {
			c.decode(h.HeaderBlockFragment())
			if h.StreamEnded() {
				got[h.StreamID] = true
			}
		}
	}
	if !got[1] || !got[3] {
		t.Fatalf("answered %v, want 1 and 3", got)
	}
	// A slot is free again.
	c.call(7, "/test.Echo/Echo", echoBody(t, []byte("x")))
	if a := c.readAnswer(7); a.status() != "0" {
		t.Fatalf("got %v", a)
	}
}

// TestSendFlowControl checks that the server never sends more DATA than
// the client's windows allow, and finishes the answer as the client
// grants more.
func TestSendFlowControl(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxMsgBytes: 1 << 20}})
	c := dial(t, tb.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	payload := bytes.Repeat([]byte("0123456789"), 10_000)
	c.call(1, "/test.Echo/Echo", echoBody(t, payload))
	stream, conn := int64(10), int64(defaultWindow)
	var a answer
	take := func(f http2.Frame) {
		switch f := f.(type) {
		case *http2.HeadersFrame:
			fields := c.decode(f.HeaderBlockFragment())
			if a.headers == nil {
				a.headers = fields
			} else {
				a.trailers = fields
			}
		case *http2.DataFrame:
			n := int64(f.Length)
			if n > stream || n > conn {
				t.Fatalf("DATA of %d bytes; the windows were %d (stream) and %d (connection)", n, stream, conn)
			}
			stream -= n
			conn -= n
			a.data = append(a.data, f.Data()...)
			a.frames = append(a.frames, int(n))
		default:
			t.Fatalf("unexpected %v", f.Header())
		}
	}
	grants := []uint32{1, 7, 1000, 8000, 3}
	for a.trailers == nil {
		if stream > 0 && conn > 0 {
			take(c.next())
			continue
		}
		// A window is empty: whatever the server sends before the answer
		// to a PING must not be DATA (take checks).
		if err := c.fr.WritePing(false, [8]byte{'f', 'c'}); err != nil {
			t.Fatal(err)
		}
		for {
			f := c.next()
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				break
			}
			take(f)
		}
		if stream == 0 {
			inc := grants[len(a.frames)%len(grants)]
			c.fr.WriteWindowUpdate(1, inc)
			stream += int64(inc)
		}
		if conn == 0 {
			c.fr.WriteWindowUpdate(0, 30_000)
			conn += 30_000
		}
	}
	if len(a.frames) < 20 {
		t.Errorf("the answer came in %d DATA frames: the windows did not hold it back", len(a.frames))
	}
	var out wrapperspb.BytesValue
	if a.status() != "0" || len(a.data) < 5 || proto.Unmarshal(a.data[5:], &out) != nil || !bytes.Equal(out.Value, payload) {
		t.Fatalf("the answer is wrong: status %q, %d bytes", a.status(), len(a.data))
	}
}

func TestMaxFrameSizeRespected(t *testing.T) {
	tb := newTestbed(t, Options{Bounds: connbounds.Bounds{MaxMsgBytes: 1 << 20}})
	for _, size := range []uint32{0, 16384, 20000, 100_000} {
		t.Run(strconv.Itoa(int(size)), func(t *testing.T) {
			settings := []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 4 << 20}}
			want := uint32(defaultFrameSize)
			if size != 0 {
				settings = append(settings, http2.Setting{ID: http2.SettingMaxFrameSize, Val: size})
				want = size
			}
			c := dial(t, tb.addr, settings...)
			c.t = t
			c.fr.WriteWindowUpdate(0, 4<<20)
			c.call(1, "/test.Echo/Echo", echoBody(t, make([]byte, 600_000)))
			a := c.readAnswer(1)
			largest := 0
			for _, n := range a.frames {
				largest = max(largest, n)
			}
			if largest != int(want) || a.status() != "0" {
				t.Fatalf("largest DATA frame %d bytes, want %d (status %q)", largest, want, a.status())
			}
		})
	}
}

// TestHeaderTableSize checks that the server follows the client's
// SETTINGS_HEADER_TABLE_SIZE: a smaller table is announced by a dynamic
// table size update at the start of the next header block (RFC 7541, 4.2;
// nghttp2, which Envoy uses, rejects a block without it).
func TestHeaderTableSize(t *testing.T) {
	tb := newTestbed(t, Options{})
	// sizeUpdate returns the first size update of a block, if any.
	sizeUpdate := func(b []byte) (uint32, bool) {
		if len(b) == 0 || b[0]&0xe0 != 0x20 {
			return 0, false
		}
		v := uint32(b[0] & 0x1f)
		if v == 0x1f {
			m := uint(0)
			for _, c := range b[1:] {
				v += uint32(c&0x7f) << m
				m += 7
				if c&0x80 == 0 {
					break
				}
			}
		}
		return v, true
	}
	// answers makes n Echo calls and returns their first header blocks.
	answers := func(c *rawClient, id *uint32, n int) [][]byte {
		var blocks [][]byte
		for range n {
			c.call(*id, "/test.Echo/Echo", echoBody(t, []byte("t")))
			var first []byte
			for {
				f := c.next()
				if h, ok := f.(*http2.HeadersFrame); ok {
					c.decode(h.HeaderBlockFragment())
					if first == nil {
						first = bytes.Clone(h.HeaderBlockFragment())
					}
				}
				if f.Header().Flags.Has(http2.FlagDataEndStream) {
					break
				}
			}
			blocks = append(blocks, first)
			*id += 2
		}
		return blocks
	}
	setTable := func(c *rawClient, size uint32) {
		if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: size}); err != nil {
			t.Fatal(err)
		}
		if f, ok := c.next().(*http2.SettingsFrame); !ok || !f.IsAck() {
			t.Fatalf("want a SETTINGS ACK, got %v", f)
		}
		c.dec.SetAllowedMaxDynamicTableSize(size)
	}
	for _, tc := range []struct {
		name    string
		initial bool   // size is in the first SETTINGS, else it comes after two answers
		size    uint32 // the SETTINGS_HEADER_TABLE_SIZE
		steady  int    // the length of a block once the table is settled
	}{
		// Too small for content-type: literals.
		{"initial 0", true, 0, 32},
		{"initial 64", true, 64, 32},
		{"later 0", false, 0, 32},
		{"later 64", false, 64, 32},
		// Large enough: :status and content-type are one byte each.
		{"initial 1024", true, 1024, 2},
		{"later 1024", false, 1024, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var settings []http2.Setting
			if tc.initial {
				settings = append(settings, http2.Setting{ID: http2.SettingHeaderTableSize, Val: tc.size})
			}
			c := dial(t, tb.addr, settings...)
			c.t = t
			id := uint32(1)
			if tc.initial {
				c.dec.SetAllowedMaxDynamicTableSize(tc.size)
			} else {
				answers(c, &id, 2)
				setTable(c, tc.size)
			}
			blocks := answers(c, &id, 3)
			if v, ok := sizeUpdate(blocks[0]); !ok || v > tc.size {
				t.Fatalf("the block after the change (%x) does not start with a size update to at most %d", blocks[0], tc.size)
			}
			for _, b := range blocks[1:] {
				if _, ok := sizeUpdate(b); ok {
					t.Errorf("a second size update: %x", b)
				}
			}
			if n := len(blocks[2]); n != tc.steady {
				t.Errorf("a settled block has %d bytes, want %d (%x)", n, tc.steady, blocks[2])
			}
		})
	}
}

func TestGracefulStopRefusesLaterStreams(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	c.call(1, "/test.Echo/Wait", message(0, nil))
	<-tb.started
	stopped := make(chan struct{})
	go func() { tb.srv.GracefulStop(); close(stopped) }()
	g, ok := c.next().(*http2.GoAwayFrame)
	if !ok || g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
		t.Fatalf("want GOAWAY NO_ERROR naming stream 1, got %v", g)
	}
	// A PING follows: a stream the client sends before its ACK (before it
	// read the GOAWAY) is refused, not lost to a closed connection.
	p, ok := c.next().(*http2.PingFrame)
	if !ok || p.IsAck() {
		t.Fatalf("want a PING after the GOAWAY, got %v", p)
	}
	c.call(3, "/test.Echo/Echo", echoBody(t, nil))
	c.expectRST(3, http2.ErrCodeRefusedStream)
	c.pingPong() // stream 3's DATA did not end the connection
	if err := c.fr.WritePing(true, p.Data); err != nil {
		t.Fatal(err)
	}
	close(tb.release)
	if a := c.readAnswer(1); a.status() != "0" {
		t.Fatalf("the call in progress: %v", a)
	}
	c.expectClosed()
	c.nc.Close()
	select {
	case <-stopped:
	case <-time.After(frameWait):
		t.Fatal("GracefulStop did not return")
	}
}

func TestClientResetCancelsCall(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	c.call(1, "/test.Echo/Wait", message(0, nil))
	<-tb.started
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-tb.ctxErrs:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context ended with %v", err)
		}
	case <-time.After(frameWait):
		t.Fatal("RST_STREAM did not cancel the handler's context")
	}
	// Nothing more is sent on stream 1; the connection goes on.
	c.call(3, "/test.Echo/Echo", echoBody(t, []byte("x")))
	if a := c.readAnswer(3); a.status() != "0" {
		t.Fatalf("got %v", a)
	}
	c.pingPong()
}

// TestHeaderBlockInContinuations checks that a header block split over
// CONTINUATION frames, up to connbounds.MaxContinuations of them, is decoded like
// one in a single frame: a call succeeds, a malformed block resets its
// stream, and the HPACK state carries over to the next block.
func TestHeaderBlockInContinuations(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	split := func(id uint32, end bool, b []byte, parts int) {
		n := (len(b) + parts - 1) / parts
		first := b[:min(n, len(b))]
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: end, EndHeaders: len(first) == len(b)}); err != nil {
			t.Fatal(err)
		}
		for b = b[len(first):]; len(b) > 0; {
			frag := b[:min(n, len(b))]
			b = b[len(frag):]
			if err := c.fr.WriteContinuation(id, len(b) == 0, frag); err != nil {
				t.Fatal(err)
			}
		}
	}
	echo := request("/test.Echo/Echo")
	split(1, false, c.block(echo), 1+connbounds.MaxContinuations)
	c.data(1, true, echoBody(t, []byte("split")))
	if a := c.readAnswer(1); a.status() != "0" {
		t.Fatalf("a call in %d header frames: %v", 1+connbounds.MaxContinuations, a)
	}
	split(3, false, c.block(with(request("/test.Echo/Echo"), "X-Up", "1")), 3)
	c.expectRST(3, http2.ErrCodeProtocol)
	c.call(5, "/test.Echo/Echo", echoBody(t, []byte("after"))) // indexed by the blocks before
	if a := c.readAnswer(5); a.status() != "0" {
		t.Fatalf("a call after: %v", a)
	}
}

// TestDrainRefusesCallsInFlight checks that a connection with no call open
// is not closed as soon as its graceful GOAWAY leaves: a call the client
// sent before reading the GOAWAY is refused with REFUSED_STREAM (which
// clients retry) until the client acknowledges the PING after the GOAWAY.
// The idle sweep drains connections this way too.
func TestDrainRefusesCallsInFlight(t *testing.T) {
	tb := newTestbed(t, Options{})
	c := dial(t, tb.addr)
	stopped := make(chan struct{})
	go func() { tb.srv.GracefulStop(); close(stopped) }()
	if g, ok := c.next().(*http2.GoAwayFrame); !ok || g.ErrCode != http2.ErrCodeNo {
		t.Fatalf("want GOAWAY NO_ERROR, got %v", g)
	}
	p, ok := c.next().(*http2.PingFrame)
	if !ok || p.IsAck() {
		t.Fatalf("want a PING after the GOAWAY, got %v", p)
	}
	c.call(1, "/test.Echo/Echo", echoBody(t, nil)) // sent before the client read the GOAWAY
	c.expectRST(1, http2.ErrCodeRefusedStream)
	if err := c.fr.WritePing(true, p.Data); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
	c.nc.Close()
	select {
	case <-stopped:
	case <-time.After(frameWait):
		t.Fatal("GracefulStop did not return")
	}
}
