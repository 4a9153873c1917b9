package jsonscan

import (
	"bytes"
	"math/bits"
)

// MemoBytes bounds what a Memo keeps of a line.
const MemoBytes = 512

// Memo lets a Scanner skip what a document shares with the one before: the
// events of a stream repeat a long prefix (OpenAI's chunks repeat the id,
// model and fingerprint before each delta; Anthropic's, the type and
// index), and in Wasm scanning those bytes costs ten times what comparing
// them does. A Memo keeps the first MemoBytes of the last document's first
// line and a copy of the Scanner's state at a point in it: the last quote
// before where the last two documents parted, which is where the next one
// likely parts too (the text of a delta). A document that begins with the
// bytes up to that point takes the state and is scanned from there; one
// that parts earlier is scanned whole, and moves the point back. The
// result is the same as without a Memo: a Scanner's state depends only on
// the bytes it read.
type Memo struct {
	buf  [MemoBytes]byte
	n    int     // valid bytes in buf: the last document's first line
	at   int     // the snapshot's offset in buf (0: none)
	snap Scanner // the state after buf[:at]

	// The line in progress.
	pos      int  // its bytes so far
	deferred bool // buf[:pos] equals them, and the Scanner has not read them
}

// Begin starts the first line of a new document, whose Scanner was Reset.
func (m *Memo) Begin() {
	m.pos, m.deferred = 0, m.n > 0
}

// Line is sc.WriteLine(q) for the first line of a document begun with
// Begin.
func (m *Memo) Line(sc *Scanner, q []byte) int {
	end := LineEnd(q)
	q = q[:end]
	i := 0
	if m.deferred {
		lim := min(len(q), m.n-m.pos)
		i = commonPrefix(q[:lim], m.buf[m.pos:m.pos+lim])
		if m.pos += i; i == len(q) && m.pos < m.n {
			return end // all alike so far
		}
		m.resolve(sc) // parted, or past what buf holds
	}
	rest := q[i:]
	if m.pos < MemoBytes {
		copy(m.buf[m.pos:], rest)
	}
	sc.WriteLine(rest)
	m.pos += len(rest)
	return end
}

// Flush gives sc what the Memo holds back of the line so far (to read the
// Scanner before the line ends).
func (m *Memo) Flush(sc *Scanner) {
	if m.deferred {
		m.resolve(sc)
	}
}

// End ends the first line; with drop (the document was not read to its
// end) the Memo forgets all.
func (m *Memo) End(sc *Scanner, drop bool) {
	if drop {
		*m = Memo{}
		return
	}
	m.Flush(sc)
	m.n = min(m.pos, MemoBytes)
}

// resolve gives sc the bytes buf[:pos], which the line shares with the
// last one: from the snapshot when it lies within them, taking a new one at
// the last quote among them.
func (m *Memo) resolve(sc *Scanner) {
	m.deferred = false
	at := max(bytes.LastIndexByte(m.buf[:m.pos], '"'), 0)
	from := 0
	if m.at > 0 && m.at <= at {
		*sc, from = m.snap, m.at
	}
	if at > from {
		sc.WriteLine(m.buf[from:at])
		m.snap, from = *sc, at
	}
	m.at = at
	sc.WriteLine(m.buf[from:m.pos])
}

// commonPrefix is the length of the longest common prefix of a and b,
// eight bytes at a time.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for ; i+8 <= n; i += 8 {
		if x := le64(a[i:]) ^ le64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)>>3
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
