package grpcunary

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestHeaderDecoderMatchesFramer decodes random request header blocks
// (valid, malformed, oversized, mixed pseudo-headers) on one connection's
// worth of HPACK state, with headerDecoder and with x/net's Framer decoding
// them itself, and wants the same fields, the same truncation and the same
// kind of error.
func TestHeaderDecoderMatchesFramer(t *testing.T) {
	const max = 1024
	rng := rand.New(rand.NewPCG(5, 6))
	seen := map[string]int{} // outcomes, so that the test knows it saw each
	good := []string{":method", ":path", ":scheme", ":authority", "content-type", "te", "grpc-timeout", "user-agent",
		"trailer", "x-a"}
	bad := []string{":status", ":bogus", "x-Upper", "bad name", ""}
	values := []string{"POST", "/p", "http", "", "application/grpc", "trailers", "10m", "a,b,c", strings.Repeat("v", 300)}
	huge := strings.Repeat("w", 2000) // past the longest string: a compression error
	for seq := range 200 {
		var enc bytes.Buffer
		he := hpack.NewEncoder(&enc)
		ours := newHeaderDecoder(max)
		theirs := hpack.NewDecoder(4096, nil)
		for blk := range 20 {
			enc.Reset()
			var want []hpack.HeaderField
			for range rng.IntN(10) {
				hf := hpack.HeaderField{Name: good[rng.IntN(len(good))], Value: values[rng.IntN(len(values))],
					Sensitive: rng.IntN(8) == 0}
				switch rng.IntN(40) {
				case 0, 1:
					hf.Name = bad[rng.IntN(len(bad))]
				case 2:
					hf.Value = "bad\x00value"
				case 3:
					if rng.IntN(4) == 0 {
						hf.Value = huge
					}
				}
				want = append(want, hf)
			}
			if rng.IntN(4) > 0 { // mostly pseudo-headers first, as they must be
				slices.SortStableFunc(want, func(a, b hpack.HeaderField) int {
					return boolInt(!strings.HasPrefix(a.Name, ":")) - boolInt(!strings.HasPrefix(b.Name, ":"))
				})
			}
			for _, hf := range want {
				if err := he.WriteField(hf); err != nil {
					t.Fatal(err)
				}
			}
			block := bytes.Clone(enc.Bytes())
			var frame bytes.Buffer
			if err := http2.NewFramer(&frame, nil).WriteHeaders(http2.HeadersFrameParam{
				StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(nil, bytes.NewReader(frame.Bytes()))
			fr.SetMaxReadFrameSize(1 << 20)
			fr.ReadMetaHeaders, fr.MaxHeaderListSize = theirs, max
			theirF, theirErr := fr.ReadFrame()

			raw := http2.NewFramer(nil, bytes.NewReader(frame.Bytes()))
			raw.SetMaxReadFrameSize(1 << 20)
			f, err := raw.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			hf := f.(*http2.HeadersFrame)
			ourF, ourErr := ours.decode(hf, hf.HeaderBlockFragment())
			where := func() string { return "sequence " + strconv.Itoa(seq) + " block " + strconv.Itoa(blk) }
			seen[kind(theirErr)]++
			if theirErr == nil && theirF.(*http2.MetaHeadersFrame).Truncated {
				seen["truncated"]++
			}
			if kind(ourErr) != kind(theirErr) {
				t.Fatalf("%s %v: error %v, x/net's %v", where(), want, ourErr, theirErr)
			}
			if theirErr != nil {
				var ce http2.ConnectionError
				if errors.As(theirErr, &ce) {
					break // the connection would end: its HPACK state is gone
				}
				continue
			}
			tm := theirF.(*http2.MetaHeadersFrame)
			if ourF.Truncated != tm.Truncated || !slices.Equal(ourF.Fields, tm.Fields) {
				t.Fatalf("%s: fields %v (truncated %v), x/net's %v (%v)", where(), ourF.Fields, ourF.Truncated, tm.Fields, tm.Truncated)
			}
		}
	}
	t.Logf("outcomes: %v", seen)
	for _, k := range []string{"none", "truncated", "stream PROTOCOL_ERROR", "connection COMPRESSION_ERROR"} {
		if seen[k] < 10 {
			t.Errorf("only %d blocks ended %q", seen[k], k)
		}
	}
}

// kind names the class of a decoding error: none, stream, connection (with
// its code), other.
func kind(err error) string {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &se):
		return "stream " + se.Code.String()
	case errors.As(err, &ce):
		return "connection " + http2.ErrCode(ce).String()
	}
	return "other: " + err.Error()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
