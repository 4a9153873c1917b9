package grpcunary

import (
	"errors"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerDecoder decodes a connection's request header blocks. It makes the
// checks x/net/http2's Framer makes when it decodes them itself
// (Framer.ReadMetaHeaders), with the same errors, but into storage it
// reuses: the Framer allocated a MetaHeadersFrame, its Fields and the
// closures of every block, 8 objects and 740 bytes a call under grpc-go's
// client, a third of everything the server allocated. A frame it returns
// is valid until the next block.
type headerDecoder struct {
	dec *hpack.Decoder
	max uint32 // MaxHeaderBytes

	// The block being decoded.
	fields     []hpack.HeaderField
	remain     uint32 // of the header list's budget
	trailers   uint32 // of the budget of "trailer" values (as x/net counts them)
	sawRegular bool
	invalid    error // the first malformed field
	truncated  bool  // past the budget: the rest is decoded, not kept
	frame      http2.MetaHeadersFrame
}

// newHeaderDecoder returns a decoder for header lists of at most max bytes
// (HPACK's size: name, value and 32 per field), with the dynamic table size
// a peer may assume (4096, RFC 9113 6.5.2).
func newHeaderDecoder(max uint32) *headerDecoder {
	d := &headerDecoder{max: max}
	d.dec = hpack.NewDecoder(4096, d.emit)
	d.dec.SetMaxStringLength(int(max))
	return d
}

// decode decodes block, the whole header block of HEADERS frame hf: the
// decoded frame, or a connection error (a block far past what the budget
// can take, or one that breaks HPACK) or a stream error (a malformed field
// or pseudo-header set, with the reason as its Cause).
func (d *headerDecoder) decode(hf *http2.HeadersFrame, block []byte) (*http2.MetaHeadersFrame, error) {
	clear(d.fields)
	d.fields = d.fields[:0]
	d.remain, d.trailers = d.max, d.max
	d.sawRegular, d.invalid, d.truncated = false, nil, false
	d.dec.SetEmitEnabled(true)
	if int64(len(block)) > 2*int64(d.remain+d.trailers) {
		return nil, http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if _, err := d.dec.Write(block); err != nil {
		return nil, http2.ConnectionError(http2.ErrCodeCompression)
	}
	if err := d.dec.Close(); err != nil {
		return nil, http2.ConnectionError(http2.ErrCodeCompression)
	}
	if d.invalid == nil {
		d.invalid = checkPseudos(d.fields)
	}
	if d.invalid != nil {
		return nil, http2.StreamError{StreamID: hf.StreamID, Code: http2.ErrCodeProtocol, Cause: d.invalid}
	}
	d.frame = http2.MetaHeadersFrame{HeadersFrame: hf, Fields: d.fields, Truncated: d.truncated}
	return &d.frame, nil
}

// emit takes one decoded field.
func (d *headerDecoder) emit(hf hpack.HeaderField) {
	if !httpguts.ValidHeaderFieldValue(hf.Value) {
		d.invalid = errors.New("invalid header field value for " + quoteName(hf.Name))
	}
	if strings.HasPrefix(hf.Name, ":") {
		if d.sawRegular {
			d.invalid = errors.New("pseudo header field after regular")
		}
	} else {
		d.sawRegular = true
		if !validFieldName(hf.Name) {
			d.invalid = errors.New("invalid header field name " + quoteName(hf.Name))
		}
	}
	if d.invalid != nil {
		d.dec.SetEmitEnabled(false)
		return
	}
	remain, size := &d.remain, hf.Size()
	if hf.Name == "trailer" {
		n := uint32(strings.Count(hf.Value, ",") + 1)
		remain, size = &d.trailers, uint32(len(hf.Value))-n+1+n*hpack.HeaderField{}.Size()
	}
	if size > *remain {
		d.dec.SetEmitEnabled(false)
		d.truncated = true
		d.remain, d.trailers = 0, 0
		return
	}
	*remain -= size
	d.fields = append(d.fields, hf)
}

// validFieldName reports whether a regular field's name is a lower-case
// token (RFC 9113, 8.2.1).
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !httpguts.IsTokenRune(r) || ('A' <= r && r <= 'Z') {
			return false
		}
	}
	return true
}

// checkPseudos refuses unknown or repeated pseudo-headers, and request and
// response pseudo-headers together (RFC 9113, 8.3). Pseudo-headers come
// first (emit made sure).
func checkPseudos(fields []hpack.HeaderField) error {
	var request, response bool
	for i, hf := range fields {
		if !strings.HasPrefix(hf.Name, ":") {
			break
		}
		switch hf.Name {
		case ":method", ":path", ":scheme", ":authority", ":protocol":
			request = true
		case ":status":
			response = true
		default:
			return errors.New("invalid pseudo-header " + quoteName(hf.Name))
		}
		for _, prev := range fields[:i] {
			if prev.Name == hf.Name {
				return errors.New("duplicate pseudo-header " + quoteName(hf.Name))
			}
		}
	}
	if request && response {
		return errors.New("mix of request and response pseudo headers")
	}
	return nil
}

// quoteName quotes a field name for an error, cut to 64 bytes.
func quoteName(name string) string {
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return `"` + name + `"`
}
