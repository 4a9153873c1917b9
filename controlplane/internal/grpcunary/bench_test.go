package grpcunary

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// BenchmarkBatchCall measures a batch method's call over loopback, 16
// calls in flight on one connection, as the control plane serves
// ShouldRateLimit. Its allocs/op (client and server together) guard the
// allowed path against new per-call allocations.
func BenchmarkBatchCall(b *testing.B) {
	srv := New(Options{})
	srv.HandleBatch("/b.S/Batch", func(ctx context.Context, calls []Call) {
		for i := range calls {
			calls[i].Resp = calls[i].Req
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range request("/b.S/Batch") {
		enc.WriteField(f)
	}
	msg := make([]byte, 5+200)
	binary.BigEndian.PutUint32(msg[1:5], 200)
	// One call's frames; the stream id is patched in for each call.
	var call bytes.Buffer
	call.Write(appendFrameHeader(nil, block.Len(), http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1))
	call.Write(block.Bytes())
	call.Write(appendFrameHeader(nil, len(msg), http2.FrameData, http2.FlagDataEndStream, 1))
	call.Write(msg)
	tmpl := call.Bytes()
	dataAt := 9 + block.Len()

	io.WriteString(nc, clientPreface)
	fr := http2.NewFramer(nc, nc)
	fr.SetReuseFrames()
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30-defaultWindow)
	const inFlight = 16
	buf := make([]byte, 0, inFlight*len(tmpl))
	id := uint32(1)
	send := func(n int) {
		buf = buf[:0]
		for range n {
			at := len(buf)
			buf = append(buf, tmpl...)
			binary.BigEndian.PutUint32(buf[at+5:], id)
			binary.BigEndian.PutUint32(buf[at+dataAt+5:], id)
			id += 2
		}
		if _, err := nc.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	sent, done := 0, 0
	for done < b.N {
		if n := min(inFlight-(sent-done), b.N-sent); n > 0 {
			send(n)
			sent += n
		}
		f, err := fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				done++
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.GoAwayFrame, *http2.RSTStreamFrame:
			b.Fatalf("unexpected %v", f)
		}
	}
}
