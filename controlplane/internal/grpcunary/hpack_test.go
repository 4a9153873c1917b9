package grpcunary

import (
	"fmt"
	"testing"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// decodeAll decodes blocks in order with one HPACK decoder, as the peer
// does, and returns each block's fields as "name: value" lines.
func decodeAll(t *testing.T, blocks ...[]byte) [][]string {
	t.Helper()
	d := hpack.NewDecoder(4096, nil)
	var out [][]string
	for i, b := range blocks {
		fields, err := d.DecodeFull(b)
		if err != nil {
			t.Fatalf("block %d (%x): %v", i, b, err)
		}
		var lines []string
		for _, f := range fields {
			lines = append(lines, f.Name+": "+f.Value)
		}
		out = append(out, lines)
	}
	return out
}

func TestEncoderBlocks(t *testing.T) {
	okHeaders := fmt.Sprint([]string{":status: 200", "content-type: application/grpc"})
	okTrailers := fmt.Sprint([]string{"grpc-status: 0"})
	errBlock := fmt.Sprint([]string{":status: 200", "content-type: application/grpc", "grpc-status: 5", "grpc-message: no%0Apolicy"})
	errTrl := appendTrailersOnly(nil, codes.NotFound, "no\npolicy")

	for _, tc := range []struct {
		name   string
		before func(e *encoder) // a SETTINGS_HEADER_TABLE_SIZE before the first answer
		middle func(e *encoder) // one after the second answer
		sizes  []int            // the expected length of each block
	}{
		{name: "indexed", sizes: []int{19, 15, 2, 1, 2, 1, 0}},
		// A size update of 2 bytes, then literals.
		{name: "small table first", before: func(e *encoder) { e.setTableSize(100) }, sizes: []int{34, 15, 32, 15, 32, 15, 0}},
		{name: "large table first", before: func(e *encoder) { e.setTableSize(65536) }, sizes: []int{19, 15, 2, 1, 2, 1, 0}},
		// The same size again changes nothing.
		{name: "same table later", middle: func(e *encoder) { e.setTableSize(4096) }, sizes: []int{19, 15, 2, 1, 2, 1, 0}},
		// A size update of 3 bytes; the entries still fit.
		{name: "smaller table later", middle: func(e *encoder) { e.setTableSize(1024) }, sizes: []int{19, 15, 2, 1, 5, 1, 0}},
		// The entries no longer fit: a size update of 2 bytes, then literals.
		{name: "tiny table later", middle: func(e *encoder) { e.setTableSize(50) }, sizes: []int{19, 15, 2, 1, 34, 15, 0}},
		{name: "two changes", middle: func(e *encoder) { e.setTableSize(1024); e.setTableSize(2048) }, sizes: []int{19, 15, 2, 1, 5, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e encoder
			if tc.before != nil {
				tc.before(&e)
			}
			var blocks [][]byte
			for i := range 3 {
				if i == 2 && tc.middle != nil {
					tc.middle(&e)
				}
				blocks = append(blocks, e.headers(nil), e.trailers(nil))
			}
			blocks = append(blocks, append(e.start(nil), errTrl...))
			got := decodeAll(t, blocks...)
			for i, fields := range got {
				want := okHeaders
				switch {
				case i == 6:
					want = errBlock
				case i%2 == 1:
					want = okTrailers
				}
				if fmt.Sprint(fields) != want {
					t.Errorf("block %d: %v, want %v", i, fields, want)
				}
			}
			for i, n := range tc.sizes {
				if n != 0 && len(blocks[i]) != n {
					t.Errorf("block %d: %d bytes, want %d (%x)", i, len(blocks[i]), n, blocks[i])
				}
			}
		})
	}
}

func TestHTTPStatusBlock(t *testing.T) {
	got := decodeAll(t, appendHTTPStatus(nil, 415))
	if fmt.Sprint(got[0]) != fmt.Sprint([]string{":status: 415", "grpc-status: 12"}) {
		t.Fatal(got)
	}
}
