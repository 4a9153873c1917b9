//go:build sluicetest

package main

import "github.com/sluicehq/sluice/filter/native/internal/dynmod"

// TestPanicHeader names the hook in which a request of a sluicetest build
// makes the host panic: request_headers, answer, response_headers.
const TestPanicHeader = "x-sluice-test-panic"

// testPanic panics in hook when s's request asks for it with
// TestPanicHeader: the tests of a panic inside Envoy.
func testPanic(hook string, s *stream) {
	if s == nil || s.dead {
		return
	}
	if v, ok := s.ds.HeaderView(dynmod.RequestHeaders, TestPanicHeader); ok && v == hook {
		panic("sluicetest: a panic asked for in " + hook)
	}
}
