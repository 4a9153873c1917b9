package rlsproto

import (
	"encoding/binary"
	"errors"
	"math"
	"unsafe"

	"github.com/sluicehq/sluice/algorithms"
)

// Code is a RateLimitResponse.Code.
type Code uint32

// The response codes.
const (
	CodeUnknown   Code = 0
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

// Status is one DescriptorStatus, in the order of the request's descriptors.
type Status struct {
	Code               Code
	HasLimit           bool            // current_limit was set
	RequestsPerUnit    uint32          // current_limit.requests_per_unit
	Unit               algorithms.Unit // current_limit.unit
	UnitMultiplier     uint32          // current_limit.unit_multiplier; 0 when unset (means 1)
	Name               string          // current_limit.name
	LimitRemaining     uint32
	HasReset           bool  // duration_until_reset was set
	DurationUntilReset int64 // nanoseconds
	Quota              Quota // quota (see Quota)
}

// Window returns the window of current_limit in nanoseconds (unit times
// multiplier), 0 when unknown.
func (s *Status) Window() int64 {
	w := s.Unit.Seconds() * 1e9
	if s.UnitMultiplier > 1 {
		w *= int64(s.UnitMultiplier)
	}
	return w
}

// Header is one HeaderValue of response_headers_to_add or
// request_headers_to_add.
type Header struct {
	Key   string
	Value string
}

// Response is a decoded RateLimitResponse. Its strings point into the
// message it was decoded from and are valid only as long as that is.
// Reuse a Response across calls: once its slices have grown, Decode
// allocates nothing.
type Response struct {
	OverallCode          Code
	Statuses             []Status
	ResponseHeadersToAdd []Header
	RequestHeadersToAdd  []Header
	// Limits holds the sluice dynamic metadata (see MetadataKey), one entry
	// per descriptor; HasLimits is false when the response carried none.
	Limits    []LimitInfo
	HasLimits bool
}

// Errors of the decoder. They are values so that failing allocates nothing.
var (
	ErrTruncated    = errors.New("rlsproto: message truncated")
	ErrMalformed    = errors.New("rlsproto: malformed message")
	ErrFrameMissing = errors.New("rlsproto: no gRPC message in the body")
	ErrFrameLength  = errors.New("rlsproto: gRPC message length does not match the body")
	ErrCompressed   = errors.New("rlsproto: gRPC message is compressed")
)

// ParseFrame returns the message of a body holding exactly one
// uncompressed gRPC message.
func ParseFrame(body []byte) ([]byte, error) {
	if len(body) < FrameHeaderLen {
		return nil, ErrFrameMissing
	}
	if body[0] != 0 {
		return nil, ErrCompressed
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if uint64(n) != uint64(len(body)-FrameHeaderLen) {
		return nil, ErrFrameLength
	}
	return body[FrameHeaderLen:], nil
}

// reader walks the fields of one message.
type reader struct {
	b []byte
}

func (r *reader) varint() (uint64, error) {
	if v, ok := r.short(); ok {
		return v, nil
	}
	return r.longVarint()
}

// short reads a varint of one byte (every tag, and most lengths and values
// of these messages); ok is false, and nothing is read, for any other. It
// is small enough for the compiler to inline into the reader's other
// methods: in filter.wasm a call costs more than the decoding it makes.
func (r *reader) short() (v uint64, ok bool) {
	if len(r.b) == 0 || r.b[0] >= 0x80 {
		return 0, false
	}
	v = uint64(r.b[0])
	r.b = r.b[1:]
	return v, true
}

// longVarint is varint for a varint of more than one byte (or none).
func (r *reader) longVarint() (uint64, error) {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		if n == 0 {
			return 0, ErrTruncated
		}
		return 0, ErrMalformed
	}
	r.b = r.b[n:]
	return v, nil
}

// next returns the next field's number and wire type; ok is false at the end.
func (r *reader) next() (field uint64, wire uint64, ok bool, err error) {
	if len(r.b) == 0 {
		return 0, 0, false, nil
	}
	k, ok := r.short()
	if !ok {
		if k, err = r.longVarint(); err != nil {
			return 0, 0, false, err
		}
	}
	field, wire = k>>3, k&7
	if field == 0 {
		return 0, 0, false, ErrMalformed
	}
	return field, wire, true, nil
}

// bytes reads a length-delimited payload.
func (r *reader) bytes() ([]byte, error) { return r.bytesField(wireBytes) }

func (r *reader) fixed64() (uint64, error) {
	if len(r.b) < 8 {
		return 0, ErrTruncated
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v, nil
}

// skip skips a field's payload of the given wire type.
func (r *reader) skip(wire uint64) error {
	switch wire {
	case wireVarint:
		_, err := r.varint()
		return err
	case wireFixed64:
		_, err := r.fixed64()
		return err
	case wireBytes:
		_, err := r.bytes()
		return err
	case wireFixed32:
		if len(r.b) < 4 {
			return ErrTruncated
		}
		r.b = r.b[4:]
		return nil
	}
	return ErrMalformed // groups are not used by these messages
}

// expect checks a known field's wire type.
func expect(got, want uint64) error {
	if got != want {
		return ErrMalformed
	}
	return nil
}

// varintField reads a varint field's value after checking its wire type.
func (r *reader) varintField(wire uint64) (uint64, error) {
	if err := expect(wire, wireVarint); err != nil {
		return 0, err
	}
	if v, ok := r.short(); ok {
		return v, nil
	}
	return r.longVarint()
}

// bytesField reads a length-delimited field's value after checking its
// wire type. Its length is read inline (short): one call per field.
func (r *reader) bytesField(wire uint64) ([]byte, error) {
	if err := expect(wire, wireBytes); err != nil {
		return nil, err
	}
	n, ok := r.short()
	if !ok {
		var err error
		if n, err = r.longVarint(); err != nil {
			return nil, err
		}
	}
	if n > uint64(len(r.b)) {
		return nil, ErrTruncated
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b, nil
}

// fixed64Field reads a fixed64 field's value after checking its wire type.
func (r *reader) fixed64Field(wire uint64) (uint64, error) {
	if err := expect(wire, wireFixed64); err != nil {
		return 0, err
	}
	return r.fixed64()
}

// str returns b as a string without copying.
func str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// Decode decodes a RateLimitResponse message into resp, replacing its
// contents. Unknown fields are skipped.
func Decode(msg []byte, resp *Response) error {
	resp.OverallCode = CodeUnknown
	resp.Statuses = resp.Statuses[:0]
	resp.ResponseHeadersToAdd = resp.ResponseHeadersToAdd[:0]
	resp.RequestHeadersToAdd = resp.RequestHeadersToAdd[:0]
	resp.Limits = resp.Limits[:0]
	resp.HasLimits = false
	r := reader{msg}
	for {
		field, wire, ok, err := r.next()
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		switch field {
		case 1: // overall_code
			v, err := r.varintField(wire)
			if err != nil {
				return err
			}
			resp.OverallCode = Code(v)
		case 2: // statuses
			b, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			resp.Statuses = append(resp.Statuses, Status{})
			if err := decodeStatus(b, &resp.Statuses[len(resp.Statuses)-1]); err != nil {
				return err
			}
		case 3, 4: // response_headers_to_add, request_headers_to_add
			b, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			h, err := decodeHeader(b)
			if err != nil {
				return err
			}
			if field == 3 {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, h)
			} else {
				resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, h)
			}
		case 6: // dynamic_metadata
			b, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			if err := decodeMetadata(b, resp); err != nil {
				return err
			}
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
}

func decodeStatus(b []byte, s *Status) error {
	r := reader{b}
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		switch field {
		case 1, 3: // code, limit_remaining
			v, err := r.varintField(wire)
			if err != nil {
				return err
			}
			if field == 1 {
				s.Code = Code(v)
			} else {
				s.LimitRemaining = uint32(v)
			}
		case 2: // current_limit
			lb, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			s.HasLimit = true
			if err := decodeLimit(lb, s); err != nil {
				return err
			}
		case 4: // duration_until_reset
			db, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			d, err := decodeDuration(db)
			if err != nil {
				return err
			}
			s.HasReset, s.DurationUntilReset = true, d
		case 5: // quota
			qb, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			if err := decodeQuota(qb, &s.Quota); err != nil {
				return err
			}
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
}

func decodeLimit(b []byte, s *Status) error {
	r := reader{b}
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		switch field {
		case 1, 2: // requests_per_unit, unit
			v, err := r.varintField(wire)
			if err != nil {
				return err
			}
			if field == 1 {
				s.RequestsPerUnit = uint32(v)
			} else {
				s.Unit = algorithms.UnitUnknown
				if v <= math.MaxInt32 { // a larger number would wrap onto a unit
					s.Unit = algorithms.Unit(v)
				}
			}
		case 3: // name
			nb, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			s.Name = str(nb)
		case 4: // unit_multiplier (UInt32Value)
			wb, err := r.bytesField(wire)
			if err != nil {
				return err
			}
			v, err := decodeWrappedVarint(wb)
			if err != nil {
				return err
			}
			s.UnitMultiplier = uint32(v)
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
}

// decodeWrappedVarint decodes the value of a UInt32Value or UInt64Value.
func decodeWrappedVarint(b []byte) (uint64, error) {
	r := reader{b}
	var v uint64
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return v, err
		}
		if field == 1 {
			if v, err = r.varintField(wire); err != nil {
				return 0, err
			}
			continue
		}
		if err := r.skip(wire); err != nil {
			return 0, err
		}
	}
}

// decodeDuration decodes a google.protobuf.Duration into nanoseconds,
// saturating instead of overflowing.
func decodeDuration(b []byte) (int64, error) {
	r := reader{b}
	var secs, nanos int64
	for {
		field, wire, ok, err := r.next()
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		switch field {
		case 1, 2:
			v, err := r.varintField(wire)
			if err != nil {
				return 0, err
			}
			if field == 1 {
				secs = int64(v)
			} else {
				nanos = int64(int32(v))
			}
		default:
			if err := r.skip(wire); err != nil {
				return 0, err
			}
		}
	}
	const maxSecs = math.MaxInt64/int64(1e9) - 1
	switch {
	case secs > maxSecs:
		return math.MaxInt64, nil
	case secs < -maxSecs:
		return math.MinInt64, nil
	}
	return secs*1e9 + nanos, nil
}

// decodeHeader decodes a config.core.v3.HeaderValue. As Envoy does, it takes
// value, or raw_value when value is empty.
func decodeHeader(b []byte) (Header, error) {
	var h Header
	var raw string
	r := reader{b}
	for {
		field, wire, ok, err := r.next()
		if err != nil {
			return h, err
		}
		if !ok {
			if h.Value == "" {
				h.Value = raw
			}
			return h, nil
		}
		switch field {
		case 1, 2, 3: // key, value, raw_value
			v, err := r.bytesField(wire)
			if err != nil {
				return h, err
			}
			switch field {
			case 1:
				h.Key = str(v)
			case 2:
				h.Value = str(v)
			default:
				raw = str(v)
			}
		default:
			if err := r.skip(wire); err != nil {
				return h, err
			}
		}
	}
}
