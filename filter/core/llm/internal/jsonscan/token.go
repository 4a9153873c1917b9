package jsonscan

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
		s.vals.flags |= 1 << d.flag
	}
	if d.intSlot != None && c != 'n' && c != '-' && (c < '0' || c > '9') {
		s.vals.setBad(d.intSlot)
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
		s.js.mode, s.state, s.js.isKey = strSkip, stString, false
		switch {
		case d.capture != None:
			s.js.mode, s.js.slot = strCapture, d.capture
			s.js.capOff, s.js.capSize = int(s.schema.capOff[d.capture]), int(s.schema.capSize[d.capture])
			s.vals.capLen[d.capture] = 0
			s.vals.capOver &^= 1 << d.capture
		case d.measure != None:
			s.js.mode, s.js.slot = strMeasure, d.measure
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
		if s.js.esc != 0 {
			if !s.js.escape(&s.vals, p[i]) {
				return s.fail(i), true
			}
			i++
			continue
		}
		j := i + plain(p[i:])
		if j > i && s.js.mode != strSkip {
			s.js.text(&s.vals, p[i:j])
		}
		if i = j; i == len(p) {
			break
		}
		switch c := p[i]; {
		case c == '"':
			s.endString()
			return i + 1, false
		case c == '\\':
			s.js.esc = 1
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

// endString ends the current string (its closing quote read).
func (s *Scanner) endString() {
	s.js.flushHigh(&s.vals)
	if s.js.isKey {
		s.state = stColon
	} else {
		s.afterValue()
	}
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
	s.vals.setInt(s.numSlot, s.num, s.numOK)
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
			s.vals.setBool(s.litSlot, s.lit[0] == 't')
		}
		s.afterValue()
	}
	return i
}
