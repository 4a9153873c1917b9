package jsonscan

import "unicode/utf8"

// The byte by byte path: tokens that span pieces or have escapes, and
// the starts of values that write does not take whole.

// fail makes the document invalid at p[i].
func (s *Scanner) fail(i int) int {
	s.state, s.errAt = stError, s.base+int64(i)
	return i
}

// value starts the value whose first byte c is at offset i of the
// current piece, at node s.next: it opens a container, or readies the
// state in which resume reads a string, number or literal. It reports
// false when a container would nest deeper than MaxDepth.
func (s *Scanner) value(c byte, i int) bool {
	d := &s.schema.defs[s.next]
	if c != 'n' && d.flag != None {
		s.flags |= 1 << d.flag
	}
	if d.intSlot != None && c != 'n' && c != '-' && (c < '0' || c > '9') {
		s.setBad(d.intSlot)
	}
	switch {
	case c == '{', c == '[':
		obj := c == '{'
		node := Skip
		if obj && d.members != nil || !obj && d.array {
			node = s.next
		}
		if s.depth == MaxDepth {
			return false
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
		if d.raw != None && s.rawDepth == 0 {
			s.rawDepth, s.rawStart, s.rawCtr = s.depth, s.base+int64(i), d.raw
		}
	case c == '"':
		s.str, s.state, s.isKey = strSkip, stString, false
		switch {
		case d.capture != None:
			s.str, s.slot = strCapture, d.capture
			s.capLen[d.capture] = 0
			s.capOver &^= 1 << d.capture
		case d.measure != None:
			s.str, s.slot = strMeasure, d.measure
		}
	case c == '-' || c >= '0' && c <= '9':
		s.state, s.numSlot, s.num, s.numOK = stNumber, d.intSlot, 0, true
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
	default: // 't', 'f', 'n'
		s.state, s.litPos, s.litSlot = stLiteral, 1, d.boolSlot
		s.lit = "null"
		if c == 't' {
			s.lit = "true"
		} else if c == 'f' {
			s.lit = "false"
		}
	}
	return true
}

// resume reads the current string, number or literal from p[i], byte by
// byte, until it ends or p does. It reports stop when write must stop: at
// an error, or (with line) at a line end in a string.
func (s *Scanner) resume(p []byte, i int, line bool) (int, bool) {
	switch s.state {
	case stString:
		return s.inString(p, i, line)
	case stNumber:
		i = s.inNumber(p, i)
	case stLiteral:
		i = s.inLiteral(p, i)
	}
	return i, s.state == stError
}

// inString reads string bytes from p[i] (see resume).
func (s *Scanner) inString(p []byte, i int, line bool) (int, bool) {
	for i < len(p) {
		if s.esc != 0 {
			if !s.escape(p[i]) {
				return s.fail(i), true
			}
			i++
			continue
		}
		j := i + plain(p[i:])
		if j > i && s.str != strSkip {
			s.text(p[i:j])
		}
		if i = j; i == len(p) {
			break
		}
		switch c := p[i]; {
		case c == '"':
			s.endString()
			return i + 1, false
		case c == '\\':
			s.esc = 1
			i++
		case line && (c == '\n' || c == '\r'):
			return i, true
		default:
			return s.fail(i), true // a control character
		}
	}
	return i, false
}

// afterValue moves on once a value is complete.
func (s *Scanner) afterValue() {
	if s.depth == 0 {
		s.state = stEnd
	} else {
		s.state = stAfter
	}
}

// setBool sets a boolean slot.
func (s *Scanner) setBool(slot int, v bool) {
	bit := uint8(1) << slot
	s.boolSet |= bit
	if v {
		s.bools |= bit
	} else {
		s.bools &^= bit
	}
}

func (s *Scanner) setBad(slot int) {
	s.intBad |= 1 << slot
	s.intSet &^= 1 << slot
}

// endString ends the current string (its closing quote read).
func (s *Scanner) endString() {
	s.flushHigh()
	if s.isKey {
		s.state = stColon
	} else {
		s.afterValue()
	}
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
	s.setInt(s.numSlot, s.num, s.numOK)
	s.afterValue()
	return i
}

// setInt gives slot (None: no slot) the value v, or marks it bad.
func (s *Scanner) setInt(slot int, v uint64, ok bool) {
	switch {
	case slot == None:
	case ok:
		s.ints[slot] = int64(v)
		s.intSet |= 1 << slot
		s.intBad &^= 1 << slot
	default:
		s.setBad(slot)
	}
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
			s.setBool(s.litSlot, s.lit[0] == 't')
		}
		s.afterValue()
	}
	return i
}
