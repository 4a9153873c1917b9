package llm

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// fixture reads testdata/name.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chunking is one way of cutting a body into chunks.
type chunking struct {
	name   string
	chunks [][]byte
}

// chunkings are the ways a body is cut in the tests: whole, at every byte
// offset in two, byte by byte, and at random in up to 16 chunks (seeded).
func chunkings(b []byte) []chunking {
	cs := []chunking{{"whole", [][]byte{b}}}
	for i := 1; i < len(b); i++ {
		cs = append(cs, chunking{"cut at " + strconv.Itoa(i), [][]byte{b[:i], b[i:]}})
	}
	bytewise := make([][]byte, len(b))
	for i := range b {
		bytewise[i] = b[i : i+1]
	}
	cs = append(cs, chunking{"byte by byte", bytewise})
	rng := rand.New(rand.NewPCG(uint64(len(b)), 7))
	for k := 0; k < 20; k++ {
		var chunks [][]byte
		rest := b
		for len(rest) > 0 {
			n := 1 + rng.IntN(max(1, len(b)/8))
			n = min(n, len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		cs = append(cs, chunking{"random " + strconv.Itoa(k), chunks})
	}
	return cs
}

// withLineEnds rewrites a fixture's LF line ends as CRLF or CR.
func withLineEnds(b []byte, end string) []byte {
	return bytes.ReplaceAll(b, []byte("\n"), []byte(end))
}
