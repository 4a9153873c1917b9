package jsonscan

import (
	"bytes"
	"math/bits"
)

// state is where the Scanner is in the grammar.
type state uint8

const (
	stBegin     state = iota // before the root object
	stValue                  // a value is due; its node is s.next
	stObjFirst               // after '{': a key or '}'
	stKey                    // after ',' in an object: a key
	stColon                  // after a key: ':'
	stColonNext              // after a key already looked up (s.next): ':'
	stArrFirst               // after '[': a value or ']'
	stAfter                  // after a value: ',' or the end of its container
	stString                 // in a string (key or value)
	stNumber                 // in a number
	stLiteral                // in true, false or null
	stEnd                    // the root object is complete: only whitespace may follow
	stError                  // the document is not JSON, or too deep
)

// strMode is what the scanner does with the bytes of the current string.
type strMode uint8

const (
	strSkip    strMode = iota // nothing
	strKey                    // a key: kept (up to MaxKey) for the member lookup
	strMeasure                // a value: its decoded length is counted
	strCapture                // a value: copied to a capture (up to its size)
)

// The states of a number (RFC 8259's grammar).
const (
	nMinus = iota // after '-'
	nZero         // after a leading 0
	nInt          // in the integer digits
	nDot          // after '.'
	nFrac         // in the fraction digits
	nE            // after 'e' or 'E'
	nESign        // after the exponent's sign
	nExp          // in the exponent digits
)

// Scanner scans one document fed in pieces with Write. Its zero value is
// not usable: make one with NewScanner, reuse it with Reset.
type Scanner struct {
	schema *Schema
	state  state
	depth  int
	nodes  [MaxDepth]Node // node of each open container (Skip: not descended)
	isObj  uint64         // bit d: the container at depth d+1 is an object
	next   Node           // the node of the value due
	base   int64          // bytes written before the current piece
	errAt  int64          // offset of the byte that made the document invalid

	// An object or array measured with Def.Raw (one at a time: their
	// contents are skipped).
	rawDepth int // its depth once open; 0: none
	rawStart int64
	rawCtr   int

	js strDecoder // the current string

	// The current number or literal.
	num     uint64
	nst     uint8
	numOK   bool // a whole number in [0, MaxInt] so far
	numSlot int
	lit     string
	litPos  int
	litSlot int

	vals Values
}

// NewScanner returns a Scanner for documents of schema.
func NewScanner(schema *Schema) *Scanner {
	return &Scanner{schema: schema}
}

// Init makes s a Scanner for documents of schema (for a Scanner embedded
// in another struct).
func (s *Scanner) Init(schema *Schema) {
	*s = Scanner{schema: schema}
}

// Reset makes s ready for a new document of the same schema. It clears
// only what a document reads before it writes (not the stack, the key,
// the slots' values or the capture bytes): one Reset per SSE event.
func (s *Scanner) Reset() {
	s.state, s.depth, s.base, s.rawDepth = stBegin, 0, 0, 0
	s.js.esc, s.js.high = 0, 0
	s.vals.intSet, s.vals.intBad, s.vals.boolSet, s.vals.flags, s.vals.capOver = 0, 0, 0, 0, 0
	s.vals.counters = [MaxCounters]int64{}
	s.vals.capLen = [MaxCaptures]uint16{}
}

// Complete reports whether the root object is complete and valid (so far
// nothing but whitespace followed it).
func (s *Scanner) Complete() bool { return s.state == stEnd }

// Failed reports whether the document is not JSON (or nests deeper than
// MaxDepth, or its root is not an object).
func (s *Scanner) Failed() bool { return s.state == stError }

// Started reports whether any byte other than whitespace was written.
func (s *Scanner) Started() bool { return s.state != stBegin }

// ErrorOffset is the offset of the byte that made the document invalid.
func (s *Scanner) ErrorOffset() int64 { return s.errAt }

// Values returns what s found so far: valid until the next Reset.
func (s *Scanner) Values() *Values { return &s.vals }

// Captured returns capture c's bytes (valid until the next Reset or Write)
// and whether the string was longer than the capture's size.
func (s *Scanner) Captured(c int) (b []byte, over bool) {
	off := int(s.schema.capOff[c])
	return s.vals.capBuf[off : off+int(s.vals.capLen[c])], s.vals.capOver&(1<<c) != 0
}

// Write scans the next piece of the document. Pieces may split it
// anywhere. After an error, Write ignores what follows.
func (s *Scanner) Write(p []byte) { s.write(p, false) }

// WriteLine scans p up to its first CR or LF, which it leaves, and returns
// the number of bytes it took: an SSE data line, whose end is no byte of
// the data (the caller writes the LF that joins two data lines).
func (s *Scanner) WriteLine(p []byte) int { return s.write(p, true) }

// Byte classes of write's loop.
const (
	cBad   = iota
	cSpace // ' ', '\t'
	cEOL   // '\n', '\r'
	cQuote
	cColon
	cComma
	cOpen  // '{', '['
	cClose // '}', ']'
	cNum   // '-', '0'-'9'
	cLit   // 't', 'f', 'n'
)

var classes = func() (t [256]uint8) {
	for _, c := range "-0123456789" {
		t[c] = cNum
	}
	t[' '], t['\t'], t['\n'], t['\r'] = cSpace, cSpace, cEOL, cEOL
	t['"'], t[':'], t[','] = cQuote, cColon, cComma
	t['{'], t['['], t['}'], t[']'] = cOpen, cOpen, cClose, cClose
	t['t'], t['f'], t['n'] = cLit, cLit, cLit
	return t
}()

// write is Write and, with line, WriteLine. Its loop takes a whole token
// at a time when the token is whole in p and plain (a key or string
// without escapes, a whole number, a literal): in Wasm a function call or
// a branch costs as much as a byte's work, so the frequent cases take
// few of either. A token that spans pieces, or has escapes, goes through
// resume, byte by byte.
func (s *Scanner) write(p []byte, line bool) int {
	i := 0
	var stop bool
	if s.state >= stString {
		if s.state == stError {
			goto bad
		}
		if i, stop = s.resume(p, 0, line); stop {
			goto stopped
		}
	}
	for i < len(p) {
		c := p[i]
		switch classes[c] {
		case cSpace:
			i++
		case cEOL:
			if line {
				goto out
			}
			i++
		case cQuote:
			// k: the string's length if it is whole in p and plain; the
			// first word inline (most keys are shorter than 8 bytes).
			k := len(p)
			if i+9 <= len(p) {
				if m := special(le64(p[i+1:])); m != 0 {
					k = bits.TrailingZeros64(m) >> 3
				}
			}
			if k == len(p) {
				k = plain(p[i+1:])
			}
			whole := i+1+k < len(p) && p[i+1+k] == '"'
			if s.state == stKey || s.state == stObjFirst {
				top := s.nodes[s.depth-1]
				if whole {
					s.next = Skip
					if top != Skip && k <= MaxKey {
						s.next = s.schema.defs[top].member(p[i+1 : i+1+k])
					}
					s.state = stColonNext
					if i += k + 2; i < len(p) && p[i] == ':' { // compact JSON: one trip fewer
						s.state = stValue
						i++
					}
					continue
				}
				s.js.mode, s.js.keyLen, s.state, s.js.isKey = strSkip, 0, stString, true
				if top != Skip {
					s.js.mode = strKey
				}
			} else {
				if !s.valueAt(c) {
					goto fail
				}
				if d := &s.schema.defs[s.next]; whole && d.plainString {
					if d.measure != None {
						s.vals.counters[d.measure] += int64(k)
					}
					s.afterValue()
					i = s.comma(p, i+k+2)
					continue
				}
				s.value(c, i)
			}
			if i, stop = s.resume(p, i+1, line); stop {
				goto stopped
			}
		case cColon:
			switch s.state {
			case stColonNext:
			case stColon:
				s.next = Skip
				if top := s.nodes[s.depth-1]; top != Skip && s.js.keyLen <= MaxKey {
					s.next = s.schema.defs[top].member(s.js.key[:s.js.keyLen])
				}
			default:
				goto fail
			}
			s.state = stValue
			i++
		case cComma:
			if s.state != stAfter {
				goto fail
			}
			if s.isObj&(1<<(s.depth-1)) != 0 {
				s.state = stKey
			} else {
				s.next, s.state = s.schema.defs[s.nodes[s.depth-1]].elem, stValue
			}
			i++
		case cOpen:
			if !s.valueAt(c) || !s.value(c, i) {
				goto fail
			}
			i++
		case cClose:
			obj := c == '}'
			switch {
			case s.state == stAfter && obj == (s.isObj&(1<<(s.depth-1)) != 0):
			case s.state == stObjFirst && obj, s.state == stArrFirst && !obj:
			default:
				goto fail
			}
			if s.depth == s.rawDepth {
				s.vals.counters[s.rawCtr] += s.base + int64(i) + 1 - s.rawStart
				s.rawDepth = 0
			}
			s.depth--
			s.afterValue()
			i++
		case cNum, cLit:
			if !s.valueAt(c) {
				goto fail
			}
			j := i
			if c == 't' || c == 'f' || c == 'n' {
				j = s.literal(p, i)
			} else {
				j = s.integer(p, i)
			}
			if j > i {
				i = s.comma(p, j)
				continue
			}
			s.value(c, i) // not a plain integer or literal whole in p
			if i, stop = s.resume(p, i+1, line); stop {
				goto stopped
			}
		default:
			goto fail
		}
	}
out:
	s.base += int64(i)
	return i
stopped:
	if s.state != stError {
		goto out // at a line end, in a string
	}
	goto bad
fail:
	s.fail(i)
bad:
	if line {
		i += LineEnd(p[i:])
	} else {
		i = len(p)
	}
	s.base += int64(i)
	return i
}

// comma takes the ',' right after a member's value (compact JSON), to
// save a trip around write's loop.
func (s *Scanner) comma(p []byte, i int) int {
	if i < len(p) && p[i] == ',' && s.state == stAfter && s.isObj&(1<<(s.depth-1)) != 0 {
		s.state = stKey
		return i + 1
	}
	return i
}

// valueAt reports whether a value may start here (c is its first byte)
// and sets s.next to its node.
func (s *Scanner) valueAt(c byte) bool {
	switch s.state {
	case stValue:
		return true
	case stArrFirst:
		s.next = s.schema.defs[s.nodes[s.depth-1]].elem
		return true
	case stBegin:
		s.next = 1
		return c == '{'
	}
	return false
}

// integer takes a plain integer whole in p from p[i] (followed by a byte
// that ends it) and returns the index after it, or i when the number is
// anything else (a fraction, an exponent, a leading zero, or cut by the
// end of p): then the byte by byte path reads it.
func (s *Scanner) integer(p []byte, i int) int {
	j, neg := i, p[i] == '-'
	if neg {
		j++
	}
	start := j
	var v uint64
	for ; j < len(p); j++ {
		d := p[j] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d)
	}
	n := j - start
	if j == len(p) || n == 0 || n > 1 && p[start] == '0' || p[j] == '.' || p[j]|0x20 == 'e' {
		return i
	}
	d := &s.schema.defs[s.next]
	if d.flag != None {
		s.vals.flags |= 1 << d.flag
	}
	// 16 digits hold MaxInt, and cannot overflow v.
	s.vals.setInt(d.intSlot, v, !neg && n <= 16 && v <= MaxInt)
	s.afterValue()
	return j
}

// literal takes true, false or null whole in p from p[i] and returns the
// index after it, or i (cut by the end of p, or misspelt: the byte by byte
// path reads it, or finds the error).
func (s *Scanner) literal(p []byte, i int) int {
	n, val := 4, false
	switch {
	case i+4 <= len(p) && p[i] == 'n' && p[i+1] == 'u' && p[i+2] == 'l' && p[i+3] == 'l':
		s.afterValue()
		return i + 4
	case i+4 <= len(p) && p[i] == 't' && p[i+1] == 'r' && p[i+2] == 'u' && p[i+3] == 'e':
		val = true
	case i+5 <= len(p) && p[i] == 'f' && p[i+1] == 'a' && p[i+2] == 'l' && p[i+3] == 's' && p[i+4] == 'e':
		n = 5
	default:
		return i
	}
	d := &s.schema.defs[s.next]
	if d.flag != None {
		s.vals.flags |= 1 << d.flag
	}
	if d.intSlot != None {
		s.vals.setBad(d.intSlot)
	}
	if slot := d.boolSlot; slot != None {
		s.vals.setBool(slot, val)
	}
	s.afterValue()
	return i + n
}

// LineEnd is the index of p's first CR or LF, or len(p).
func LineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	if n < 0 {
		n = len(p)
	}
	if r := bytes.IndexByte(p[:n], '\r'); r >= 0 {
		return r
	}
	return n
}

// plain is the length of p's first run of bytes that need nothing in a
// string: no quote, backslash or control character. Eight bytes at a
// time, and the first such byte found with a count of trailing zeros: in
// Wasm a branch costs as much as a byte's work, so a byte loop is slow
// (bytes.IndexByte is fast, but it finds one byte, not three).
func plain(p []byte) int {
	i := 0
	for ; i+8 <= len(p); i += 8 {
		if m := special(le64(p[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	if i == len(p) {
		return i
	}
	if len(p) >= 8 { // the last 8 bytes, those before i masked out
		shift := uint(i-(len(p)-8)) * 8
		if m := special(le64(p[len(p)-8:])) >> shift << shift; m != 0 {
			return len(p) - 8 + bits.TrailingZeros64(m)>>3
		}
		return len(p)
	}
	for ; i < len(p); i++ {
		if c := p[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

// special marks (with its high bit) each byte of v that is a quote, a
// backslash or a control character. A mark may also fall on a byte after
// a marked one (a borrow), never before: the lowest mark is exact.
func special(v uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := v^(ones*'"'), v^(ones*'\\')
	return ((q-ones)&^q | (b-ones)&^b | (v-ones*0x20)&^v) & highs
}

// le64 reads 8 bytes little-endian (one load once compiled; not
// encoding/binary, which would bring reflect into the filter).
func le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}
