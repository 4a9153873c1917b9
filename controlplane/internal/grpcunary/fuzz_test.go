package grpcunary

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
)

// fuzzSeed returns a client's side of a connection after the preface: its
// SETTINGS, a unary call, a batch call, a PING, a WINDOW_UPDATE, a
// RST_STREAM and a call whose header block has CONTINUATION frames.
func fuzzSeed() []byte {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func(path string) []byte {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
			{Name: ":authority", Value: "x"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
			{Name: "grpc-timeout", Value: "1S"},
		} {
			enc.WriteField(f)
		}
		return append([]byte(nil), hb.Bytes()...)
	}
	msg := []byte{0, 0, 0, 0, 3, 'a', 'b', 'c'}
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("/f.S/Echo"), EndHeaders: true})
	fr.WriteData(1, true, msg)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block("/f.S/Batch"), EndHeaders: true})
	fr.WriteData(3, true, msg)
	fr.WritePing(false, [8]byte{1})
	fr.WriteWindowUpdate(0, 1000)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	// A header block in three frames (see readHeaderBlock).
	b := block("/f.S/Echo")
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: b[:3]})
	fr.WriteContinuation(5, false, b[3:6])
	fr.WriteContinuation(5, true, b[6:])
	fr.WriteData(5, true, msg)
	return buf.Bytes()
}

// FuzzConn feeds a connection arbitrary bytes after the preface: the
// server must neither panic nor hang, whatever it reads.
func FuzzConn(f *testing.F) {
	f.Add(fuzzSeed())
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		srv := New(Options{Bounds: connbounds.Bounds{HandshakeTimeout: time.Second, MaxStreamsPerConn: 8, MaxMsgBytes: 1 << 10}})
		echo := func(ctx context.Context, req []byte) ([]byte, error) { return req, nil }
		srv.Handle("/f.S/Echo", echo)
		srv.HandleBatch("/f.S/Batch", func(ctx context.Context, calls []Call) {
			for i := range calls {
				calls[i].Resp = calls[i].Req
			}
		})
		client, server := net.Pipe()
		c := newConn(srv, server)
		srv.mu.Lock()
		srv.conns[c] = struct{}{}
		srv.mu.Unlock()
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go io.Copy(io.Discard, client)
		go func() {
			client.Write([]byte(clientPreface))
			client.Write(data)
			client.Close()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the connection did not end within 10 s of the client's close")
		}
		client.Close()
		srv.Stop()
	})
}
