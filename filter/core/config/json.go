package config

import (
	"strconv"
	"unicode/utf8"
)

// The filter parses its configuration with this small strict JSON reader
// instead of encoding/json, which would add about 1.4 MB to filter.wasm.

// kind is the type of a JSON value.
type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// String names the kind as a configuration error message does.
func (k kind) String() string {
	switch k {
	case kindNull:
		return "null"
	case kindBool:
		return "a boolean"
	case kindNumber:
		return "a number"
	case kindString:
		return "a string"
	case kindArray:
		return "an array"
	default:
		return "an object"
	}
}

// value is one parsed JSON value.
type value struct {
	kind    kind
	boolean bool     // kindBool
	text    string   // kindString: the decoded string; kindNumber: the literal
	items   []value  // kindArray
	members []member // kindObject, in document order
}

// member is one name/value pair of an object.
type member struct {
	name  string
	value value
}

// maxDepth bounds nesting so that hostile input cannot exhaust the stack.
const maxDepth = 32

// SyntaxError reports malformed JSON.
type SyntaxError struct {
	Offset  int    // byte offset of the problem
	Problem string // what is wrong
}

// Error implements error.
func (e *SyntaxError) Error() string {
	return "config: invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Problem
}

// parser reads one JSON document.
type parser struct {
	data []byte // the document
	pos  int    // next byte to read
}

// parseJSON parses a complete JSON document (RFC 8259): exactly one value,
// optionally surrounded by whitespace.
func parseJSON(data []byte) (value, error) {
	p := parser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return value{}, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return value{}, p.fail("unexpected data after the top-level value")
	}
	return v, nil
}

func (p *parser) fail(problem string) error {
	return &SyntaxError{Offset: p.pos, Problem: problem}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (value, error) {
	if depth > maxDepth {
		return value{}, p.fail("nested too deeply")
	}
	if p.pos >= len(p.data) {
		return value{}, p.fail("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		return value{kind: kindString, text: s}, err
	case c == 't':
		return value{kind: kindBool, boolean: true}, p.literal("true")
	case c == 'f':
		return value{kind: kindBool}, p.literal("false")
	case c == 'n':
		return value{kind: kindNull}, p.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return value{}, p.fail("unexpected character " + strconv.QuoteRune(rune(c)))
	}
}

func (p *parser) literal(word string) error {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return p.fail("invalid literal, expected " + word)
	}
	p.pos += len(word)
	return nil
}

func (p *parser) object(depth int) (value, error) {
	p.pos++ // '{'
	v := value{kind: kindObject}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return value{}, p.fail("expected a quoted member name")
		}
		at := p.pos
		name, err := p.str()
		if err != nil {
			return value{}, err
		}
		for _, m := range v.members {
			if m.name == name {
				return value{}, &SyntaxError{Offset: at, Problem: "duplicate member " + strconv.Quote(name)}
			}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return value{}, p.fail("expected ':' after member name")
		}
		p.pos++
		p.skipSpace()
		item, err := p.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		v.members = append(v.members, member{name: name, value: item})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return value{}, p.fail("unexpected end of input in object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return value{}, p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *parser) array(depth int) (value, error) {
	p.pos++ // '['
	v := value{kind: kindArray}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		item, err := p.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		v.items = append(v.items, item)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return value{}, p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return value{}, p.fail("expected ',' or ']' in array")
		}
	}
}

// number accepts the RFC 8259 number grammar and keeps the literal text.
func (p *parser) number() (value, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case p.pos < len(p.data) && p.data[p.pos] >= '1' && p.data[p.pos] <= '9':
		p.digits()
	default:
		return value{}, p.fail("invalid number")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return value{}, p.fail("invalid number: no digits after '.'")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return value{}, p.fail("invalid number: no digits in exponent")
		}
	}
	return value{kind: kindNumber, text: string(p.data[start:p.pos])}, nil
}

func (p *parser) digits() int {
	n := 0
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

// str reads a quoted string and decodes its escapes. The input must be UTF-8.
func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := p.data[start:p.pos]
			if !utf8.Valid(s) {
				return "", &SyntaxError{Offset: start, Problem: "string is not valid UTF-8"}
			}
			p.pos++
			return string(s), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.fail("control character in string")
		}
		p.pos++
	}
	buf := append([]byte(nil), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			if !utf8.Valid(buf) {
				return "", &SyntaxError{Offset: start, Problem: "string is not valid UTF-8"}
			}
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.fail("control character in string")
		case c != '\\':
			buf = append(buf, c)
			p.pos++
			continue
		}
		p.pos++ // backslash
		if p.pos >= len(p.data) {
			break
		}
		e := p.data[p.pos]
		p.pos++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			if r >= 0xD800 && r < 0xDC00 { // high surrogate: a low one must follow
				if p.pos+6 > len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
					return "", p.fail("unpaired surrogate in \\u escape")
				}
				p.pos += 2
				lo, err := p.hex4()
				if err != nil {
					return "", err
				}
				if lo < 0xDC00 || lo > 0xDFFF {
					return "", p.fail("unpaired surrogate in \\u escape")
				}
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
			} else if r >= 0xDC00 && r <= 0xDFFF {
				return "", p.fail("unpaired surrogate in \\u escape")
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", p.fail("invalid escape \\" + string(rune(e)))
		}
	}
	return "", p.fail("unterminated string")
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.data) {
		return 0, p.fail("truncated \\u escape")
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, p.fail("invalid hex digit in \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}
