package jsonscan

import "unicode/utf8"

// strDecoder decodes the string being scanned into what the schema asks of
// it: its decoded length counted, its bytes kept as a key or captured, or
// nothing. What it finds goes to the Values it is given.
type strDecoder struct {
	mode    strMode
	isKey   bool
	slot    int    // strMeasure: counter; strCapture: capture
	esc     uint8  // 0: none; 1: after '\'; 2-5: hex digits of \u read so far + 2
	unit    uint16 // the \u code unit being read
	high    uint16 // strKey, strCapture: a high surrogate waiting for its low half
	keyLen  int    // bytes of the key (may exceed MaxKey: then it matches nothing)
	key     [MaxKey]byte
	capOff  int // strCapture: the capture's offset in the Values' buffer
	capSize int // strCapture: the capture's size
}

// text takes a run of plain string bytes.
func (d *strDecoder) text(vs *Values, b []byte) {
	switch d.mode {
	case strMeasure:
		vs.counters[d.slot] += int64(len(b))
	case strKey:
		d.flushHigh(vs)
		if d.keyLen < MaxKey {
			copy(d.key[d.keyLen:], b)
		}
		d.keyLen += len(b)
	case strCapture:
		d.flushHigh(vs)
		d.capture(vs, b)
	}
}

// capture appends b to the current capture, up to its size.
func (d *strDecoder) capture(vs *Values, b []byte) {
	c := d.slot
	n, size := int(vs.capLen[c]), d.capSize
	if n+len(b) > size {
		vs.capOver |= 1 << c
		b = b[:size-n]
	}
	copy(vs.capBuf[d.capOff+n:], b)
	vs.capLen[c] = uint16(n + len(b))
}

// escape takes one byte of an escape sequence; false if it is invalid.
func (d *strDecoder) escape(vs *Values, c byte) bool {
	if d.esc == 1 {
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
			d.esc, d.unit = 2, 0
			return true
		default:
			return false
		}
		d.esc = 0
		d.text(vs, []byte{b})
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
	d.unit = d.unit<<4 | uint16(v)
	if d.esc++; d.esc == 6 {
		d.esc = 0
		d.codeUnit(vs, d.unit)
	}
	return true
}

// codeUnit takes a \u escape's UTF-16 code unit.
func (d *strDecoder) codeUnit(vs *Values, u uint16) {
	switch d.mode {
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
		vs.counters[d.slot] += n
	case strKey, strCapture:
		isHigh, isLow := u >= 0xD800 && u < 0xDC00, u >= 0xDC00 && u < 0xE000
		if d.high != 0 && isLow {
			r := rune(d.high-0xD800)<<10 | rune(u-0xDC00) + 0x10000
			d.high = 0
			d.appendRune(vs, r)
			return
		}
		d.flushHigh(vs)
		switch {
		case isHigh:
			d.high = u
		case isLow:
			d.appendRune(vs, utf8.RuneError)
		default:
			d.appendRune(vs, rune(u))
		}
	}
}

// flushHigh writes a high surrogate that no low half followed as U+FFFD.
func (d *strDecoder) flushHigh(vs *Values) {
	if d.high != 0 {
		d.high = 0
		d.appendRune(vs, utf8.RuneError)
	}
}

// appendRune adds r to the current key or capture.
func (d *strDecoder) appendRune(vs *Values, r rune) {
	var buf [utf8.UTFMax]byte
	b := utf8.AppendRune(buf[:0], r)
	if d.mode == strCapture {
		d.capture(vs, b)
		return
	}
	if d.keyLen+len(b) <= MaxKey {
		copy(d.key[d.keyLen:], b)
	}
	d.keyLen += len(b)
}
