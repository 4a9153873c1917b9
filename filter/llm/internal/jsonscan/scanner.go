package jsonscan

import "unicode/utf8"

// state is where the Scanner is in the grammar.
type state uint8

const (
	stBegin    state = iota // before the root object
	stValue                 // a value is due; its node is s.next
	stObjFirst              // after '{': a key or '}'
	stKey                   // after ',' in an object: a key
	stColon                 // after a key: ':'
	stArrFirst              // after '[': a value or ']'
	stAfter                 // after a value: ',' or the end of its container
	stString                // in a string (key or value)
	stNumber                // in a number
	stLiteral               // in true, false or null
	stEnd                   // the root object is complete: only whitespace may follow
	stError                 // the document is not JSON, or too deep
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

	// The current string.
	str    strMode
	isKey  bool
	slot   int    // strMeasure: counter; strCapture: capture
	esc    uint8  // 0: none; 1: after '\'; 2-5: hex digits of \u read so far + 2
	unit   uint16 // the \u code unit being read
	high   uint16 // strKey, strCapture: a high surrogate waiting for its low half
	keyLen int    // bytes of the key (may exceed MaxKey: then it matches nothing)
	key    [MaxKey]byte

	// The current number or literal.
	num     uint64
	nst     uint8
	numOK   bool // a whole number in [0, MaxInt] so far
	numSlot int
	lit     string
	litPos  int
	litSlot int

	ints     [MaxInts]int64
	intSet   uint32
	intBad   uint32
	bools    uint8
	boolSet  uint8
	flags    uint8
	capOver  uint8
	counters [MaxCounters]int64
	capLen   [MaxCaptures]uint16
	capBuf   [CaptureBytes]byte
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
	s.esc, s.high = 0, 0
	s.intSet, s.intBad, s.boolSet, s.flags, s.capOver = 0, 0, 0, 0, 0
	s.counters = [MaxCounters]int64{}
	s.capLen = [MaxCaptures]uint16{}
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

// Int returns slot's value, whether a value was set, and whether the last
// value found for it was not a whole number in [0, MaxInt].
func (s *Scanner) Int(slot int) (v int64, set, bad bool) {
	bit := uint32(1) << slot
	return s.ints[slot], s.intSet&bit != 0, s.intBad&bit != 0
}

// IntsSeen reports whether any slot in mask (bit i: slot i) was set or
// marked bad.
func (s *Scanner) IntsSeen(mask uint32) bool { return (s.intSet|s.intBad)&mask != 0 }

// Bool returns slot's value and whether one was found.
func (s *Scanner) Bool(slot int) (v, set bool) {
	bit := uint8(1) << slot
	return s.bools&bit != 0, s.boolSet&bit != 0
}

// Counter returns counter i.
func (s *Scanner) Counter(i int) int64 { return s.counters[i] }

// Flag reports whether flag i was set.
func (s *Scanner) Flag(i int) bool { return s.flags&(1<<i) != 0 }

// Captured returns capture c's bytes (valid until the next Reset or Write)
// and whether the string was longer than the capture's size.
func (s *Scanner) Captured(c int) (b []byte, over bool) {
	off := int(s.schema.capOff[c])
	return s.capBuf[off : off+int(s.capLen[c])], s.capOver&(1<<c) != 0
}

// Write scans the next piece of the document. Pieces may split it
// anywhere. After an error, Write ignores what follows.
func (s *Scanner) Write(p []byte) {
	i := 0
	for i < len(p) && s.state != stError {
		switch s.state {
		case stString:
			i = s.inString(p, i)
		case stNumber:
			i = s.inNumber(p, i)
		case stLiteral:
			i = s.inLiteral(p, i)
		default:
			c := p[i]
			if c == ' ' || c == '\n' || c == '\r' || c == '\t' {
				i++
				continue
			}
			i = s.structural(p, i)
		}
	}
	s.base += int64(len(p))
}

// fail makes the document invalid at p[i].
func (s *Scanner) fail(i int) int {
	s.state, s.errAt = stError, s.base+int64(i)
	return i
}

// structural handles the byte p[i] outside strings, numbers and literals
// and returns the index of the next byte to read.
func (s *Scanner) structural(p []byte, i int) int {
	c := p[i]
	switch s.state {
	case stBegin:
		if c != '{' {
			return s.fail(i)
		}
		s.next = 1
		return s.value(p, i)
	case stValue:
		return s.value(p, i)
	case stObjFirst, stKey:
		if c == '"' {
			s.str, s.keyLen, s.state, s.isKey = strSkip, 0, stString, true
			if s.nodes[s.depth-1] != Skip {
				s.str = strKey
			}
			return i + 1
		}
		if c == '}' && s.state == stObjFirst {
			return s.close(i)
		}
	case stColon:
		if c == ':' {
			s.next = Skip
			if top := s.nodes[s.depth-1]; top != Skip && s.keyLen <= MaxKey {
				s.next = s.schema.defs[top].member(s.key[:s.keyLen])
			}
			s.state = stValue
			return i + 1
		}
	case stArrFirst:
		if c == ']' {
			return s.close(i)
		}
		s.next = s.schema.defs[s.nodes[s.depth-1]].Elem
		return s.value(p, i)
	case stAfter:
		obj := s.isObj&(1<<(s.depth-1)) != 0
		switch {
		case c == ',' && obj:
			s.state = stKey
			return i + 1
		case c == ',':
			s.next, s.state = s.schema.defs[s.nodes[s.depth-1]].Elem, stValue
			return i + 1
		case c == '}' && obj, c == ']' && !obj:
			return s.close(i)
		}
	}
	return s.fail(i)
}

// value starts the value at p[i], whose node is s.next.
func (s *Scanner) value(p []byte, i int) int {
	d := &s.schema.defs[s.next]
	c := p[i]
	if c != 'n' && d.Flag != None {
		s.flags |= 1 << d.Flag
	}
	if d.Int != None && c != 'n' && c != '-' && (c < '0' || c > '9') {
		s.setBad(d.Int)
	}
	switch {
	case c == '{', c == '[':
		obj := c == '{'
		node := Skip
		if obj && d.Members != nil || !obj && d.Array {
			node = s.next
		}
		if s.depth == MaxDepth {
			return s.fail(i)
		}
		s.nodes[s.depth] = node
		if obj {
			s.isObj |= 1 << s.depth
			s.state = stObjFirst
		} else {
			s.isObj &^= 1 << s.depth
			s.state = stArrFirst
		}
		s.depth++
		if d.Raw != None && s.rawDepth == 0 {
			s.rawDepth, s.rawStart, s.rawCtr = s.depth, s.base+int64(i), d.Raw
		}
	case c == '"':
		s.str, s.state, s.isKey = strSkip, stString, false
		switch {
		case d.Capture != None:
			s.str, s.slot = strCapture, d.Capture
			s.capLen[d.Capture] = 0
			s.capOver &^= 1 << d.Capture
		case d.Measure != None:
			s.str, s.slot = strMeasure, d.Measure
		}
	case c == '-' || c >= '0' && c <= '9':
		s.state, s.numSlot, s.num, s.numOK = stNumber, d.Int, 0, true
		s.nst = nMinus
		if c != '-' {
			s.nst = nInt
			if c == '0' {
				s.nst = nZero
			}
			s.num = uint64(c - '0')
		} else {
			s.numOK = false // negative: not a count
		}
	case c == 't', c == 'f', c == 'n':
		s.state, s.litPos, s.litSlot = stLiteral, 1, d.Bool
		s.lit = "null"
		if c == 't' {
			s.lit = "true"
		} else if c == 'f' {
			s.lit = "false"
		}
	default:
		return s.fail(i)
	}
	return i + 1
}

// close ends the container that p[i] closes.
func (s *Scanner) close(i int) int {
	if s.depth == s.rawDepth {
		s.counters[s.rawCtr] += s.base + int64(i) + 1 - s.rawStart
		s.rawDepth = 0
	}
	s.depth--
	s.afterValue()
	return i + 1
}

// afterValue moves on once a value is complete.
func (s *Scanner) afterValue() {
	if s.depth == 0 {
		s.state = stEnd
	} else {
		s.state = stAfter
	}
}

func (s *Scanner) setBad(slot int) {
	s.intBad |= 1 << slot
	s.intSet &^= 1 << slot
}

// inString reads string bytes from p[i].
func (s *Scanner) inString(p []byte, i int) int {
	for i < len(p) {
		if s.esc != 0 {
			if !s.escape(p[i]) {
				return s.fail(i)
			}
			i++
			continue
		}
		start := i
		for i < len(p) {
			c := p[i]
			if c == '"' || c == '\\' || c < 0x20 {
				break
			}
			i++
		}
		if i > start {
			s.text(p[start:i])
		}
		if i == len(p) {
			return i
		}
		switch p[i] {
		case '"':
			s.flushHigh()
			if s.isKey {
				s.state = stColon
			} else {
				s.afterValue()
			}
			return i + 1
		case '\\':
			s.esc = 1
			i++
		default:
			return s.fail(i) // a control character
		}
	}
	return i
}

// text takes a run of plain string bytes.
func (s *Scanner) text(b []byte) {
	switch s.str {
	case strMeasure:
		s.counters[s.slot] += int64(len(b))
	case strKey:
		s.flushHigh()
		if s.keyLen < MaxKey {
			copy(s.key[s.keyLen:], b)
		}
		s.keyLen += len(b)
	case strCapture:
		s.flushHigh()
		s.capture(b)
	}
}

// capture appends b to the current capture, up to its size.
func (s *Scanner) capture(b []byte) {
	c := s.slot
	n, size := int(s.capLen[c]), int(s.schema.capSize[c])
	if n+len(b) > size {
		s.capOver |= 1 << c
		b = b[:size-n]
	}
	copy(s.capBuf[int(s.schema.capOff[c])+n:], b)
	s.capLen[c] = uint16(n + len(b))
}

// escape takes one byte of an escape sequence; false if it is invalid.
func (s *Scanner) escape(c byte) bool {
	if s.esc == 1 {
		var b byte
		switch c {
		case '"', '\\', '/':
			b = c
		case 'b':
			b = '\b'
		case 'f':
			b = '\f'
		case 'n':
			b = '\n'
		case 'r':
			b = '\r'
		case 't':
			b = '\t'
		case 'u':
			s.esc, s.unit = 2, 0
			return true
		default:
			return false
		}
		s.esc = 0
		s.text([]byte{b})
		return true
	}
	var v byte
	switch {
	case c >= '0' && c <= '9':
		v = c - '0'
	case c >= 'a' && c <= 'f':
		v = c - 'a' + 10
	case c >= 'A' && c <= 'F':
		v = c - 'A' + 10
	default:
		return false
	}
	s.unit = s.unit<<4 | uint16(v)
	if s.esc++; s.esc == 6 {
		s.esc = 0
		s.codeUnit(s.unit)
	}
	return true
}

// codeUnit takes a \u escape's UTF-16 code unit.
func (s *Scanner) codeUnit(u uint16) {
	switch s.str {
	case strMeasure:
		// Its length in UTF-8; each half of a surrogate pair counts 2,
		// so that a pair counts 4.
		n := int64(3)
		switch {
		case u < 0x80:
			n = 1
		case u < 0x800 || u >= 0xD800 && u < 0xE000:
			n = 2
		}
		s.counters[s.slot] += n
	case strKey, strCapture:
		isHigh, isLow := u >= 0xD800 && u < 0xDC00, u >= 0xDC00 && u < 0xE000
		if s.high != 0 && isLow {
			r := rune(s.high-0xD800)<<10 | rune(u-0xDC00) + 0x10000
			s.high = 0
			s.appendRune(r)
			return
		}
		s.flushHigh()
		switch {
		case isHigh:
			s.high = u
		case isLow:
			s.appendRune(utf8.RuneError)
		default:
			s.appendRune(rune(u))
		}
	}
}

// flushHigh writes a high surrogate that no low half followed as U+FFFD.
func (s *Scanner) flushHigh() {
	if s.high != 0 {
		s.high = 0
		s.appendRune(utf8.RuneError)
	}
}

// appendRune adds r to the current key or capture.
func (s *Scanner) appendRune(r rune) {
	var buf [utf8.UTFMax]byte
	b := utf8.AppendRune(buf[:0], r)
	if s.str == strCapture {
		s.capture(b)
		return
	}
	if s.keyLen+len(b) <= MaxKey {
		copy(s.key[s.keyLen:], b)
	}
	s.keyLen += len(b)
}

// inNumber reads number bytes from p[i]; the byte that ends the number is
// left for structural.
func (s *Scanner) inNumber(p []byte, i int) int {
	for ; i < len(p); i++ {
		c := p[i]
		digit := c >= '0' && c <= '9'
		switch s.nst {
		case nMinus:
			if !digit {
				return s.fail(i)
			}
			s.nst = nInt
			if c == '0' {
				s.nst = nZero
			}
		case nZero, nInt:
			if digit && s.nst == nInt {
				if d := uint64(c - '0'); s.num > (MaxInt-d)/10 {
					s.numOK = false
				} else {
					s.num = s.num*10 + d
				}
				continue
			}
			switch c {
			case '.':
				s.nst, s.numOK = nDot, false
			case 'e', 'E':
				s.nst, s.numOK = nE, false
			default:
				if digit { // a digit after a leading 0
					return s.fail(i)
				}
				return s.endNumber(i)
			}
		case nDot, nESign:
			if !digit {
				return s.fail(i)
			}
			s.nst++
		case nFrac, nExp:
			if digit {
				continue
			}
			if s.nst == nFrac && (c == 'e' || c == 'E') {
				s.nst = nE
				continue
			}
			return s.endNumber(i)
		case nE:
			switch {
			case c == '+' || c == '-':
				s.nst = nESign
			case digit:
				s.nst = nExp
			default:
				return s.fail(i)
			}
		}
	}
	return i
}

// endNumber completes the number that p[i] ends.
func (s *Scanner) endNumber(i int) int {
	if slot := s.numSlot; slot != None {
		if s.numOK {
			s.ints[slot] = int64(s.num)
			s.intSet |= 1 << slot
			s.intBad &^= 1 << slot
		} else {
			s.setBad(slot)
		}
	}
	s.afterValue()
	return i
}

// inLiteral reads the bytes of true, false or null from p[i].
func (s *Scanner) inLiteral(p []byte, i int) int {
	for ; i < len(p) && s.litPos < len(s.lit); i++ {
		if p[i] != s.lit[s.litPos] {
			return s.fail(i)
		}
		s.litPos++
	}
	if s.litPos == len(s.lit) {
		if s.litSlot != None && s.lit[0] != 'n' {
			bit := uint8(1) << s.litSlot
			s.boolSet |= bit
			if s.lit[0] == 't' {
				s.bools |= bit
			} else {
				s.bools &^= bit
			}
		}
		s.afterValue()
	}
	return i
}
