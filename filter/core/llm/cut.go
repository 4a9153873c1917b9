package llm

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Format is an LLM API's wire format. The readers do not need it (they
// read all three); the event that ends a cut stream does.
type Format uint8

const (
	// OpenAIChat is OpenAI's chat completions (POST /v1/chat/completions),
	// and what most "OpenAI-compatible" servers speak.
	OpenAIChat Format = iota
	// OpenAIResponses is OpenAI's Responses API (POST /v1/responses).
	OpenAIResponses
	// Anthropic is Anthropic's messages (POST /v1/messages).
	Anthropic
)

// String names the format as a configuration does.
func (f Format) String() string {
	switch f {
	case OpenAIResponses:
		return "openai_responses"
	case Anthropic:
		return "anthropic"
	default:
		return "openai_chat"
	}
}

// FormatOf is the format of a request path by its end (the part a gateway
// does not rewrite): ".../chat/completions", ".../responses",
// ".../messages"; a query string is ignored. Others are not known.
func FormatOf(path string) (Format, bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return OpenAIChat, true
	case strings.HasSuffix(path, "/responses"):
		return OpenAIResponses, true
	case strings.HasSuffix(path, "/messages"):
		return Anthropic, true
	}
	return OpenAIChat, false
}

// The error types the cut event carries: what each API says when a limit
// on tokens refuses a request, so that clients treat a cut like one.
const (
	openAIErrorType   = "tokens"
	openAIErrorCode   = "rate_limit_exceeded"
	anthropicErrorTyp = "rate_limit_error"
)

// AppendCutEvent appends to dst the SSE event that tells a client why its
// stream ends here, in f's error shape; the caller sends it, then ends the
// stream. message is the human-readable reason; seq is the Responses
// API's sequence_number (SSEReader.NextSequence), ignored by the others.
//
//	OpenAIChat:      data: {"error":{"message":"...","type":"tokens","param":null,"code":"rate_limit_exceeded"}}
//	OpenAIResponses: event: error
//	                 data: {"type":"error","code":"rate_limit_exceeded","message":"...","param":null,"sequence_number":7}
//	Anthropic:       event: error
//	                 data: {"type":"error","error":{"type":"rate_limit_error","message":"..."}}
//
// OpenAI's SDKs raise an error for a data object with an "error" member
// and for an event named error; Anthropic's for an event named error.
func AppendCutEvent(dst []byte, f Format, message string, seq int64) []byte {
	switch f {
	case OpenAIResponses:
		dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"code\":\""+openAIErrorCode+"\",\"message\":"...)
		dst = appendJSONString(dst, message)
		dst = append(dst, ",\"param\":null,\"sequence_number\":"...)
		dst = strconv.AppendInt(dst, max(seq, 0), 10)
		dst = append(dst, '}')
	case Anthropic:
		dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\""+anthropicErrorTyp+"\",\"message\":"...)
		dst = appendJSONString(dst, message)
		dst = append(dst, "}}"...)
	default:
		dst = append(dst, "data: {\"error\":{\"message\":"...)
		dst = appendJSONString(dst, message)
		dst = append(dst, ",\"type\":\""+openAIErrorType+"\",\"param\":null,\"code\":\""+openAIErrorCode+"\"}}"...)
	}
	return append(dst, "\n\n"...)
}

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes
// U+FFFD; control characters are escaped, and U+2028 and U+2029 too
// (line ends to JavaScript), so the event is one line of valid JSON.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			dst = append(dst, "\ufffd"...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
