package grpcunary

import "testing"

// TestAnswerInPlace: a batch answer appended to the Resp it was given is
// framed in place; one set otherwise is copied; both get the gRPC prefix.
func TestAnswerInPlace(t *testing.T) {
	c := &conn{}
	st := &stream{msg: make([]byte, 5, respCap)}
	resp := append(st.msg[5:], "answer"...)
	c.answer(st, resp, nil)
	if !st.ok || string(st.msg) != "\x00\x00\x00\x00\x06answer" || &st.msg[5] != &resp[0] {
		t.Fatalf("appended: msg %q (in place: %v)", st.msg, &st.msg[5] == &resp[0])
	}
	st = &stream{msg: make([]byte, 5, respCap)}
	other := []byte("elsewhere")
	c.answer(st, other, nil)
	if string(st.msg) != "\x00\x00\x00\x00\x09elsewhere" || &st.msg[5] == &other[0] {
		t.Fatalf("set: msg %q", st.msg)
	}
	st = &stream{}
	c.answer(st, nil, nil)
	if string(st.msg) != "\x00\x00\x00\x00\x00" {
		t.Fatalf("empty: msg %q", st.msg)
	}
}
