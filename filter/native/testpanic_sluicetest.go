//go:build sluicetest

package main

import "github.com/sluicehq/sluice/filter/native/internal/dynmod"

// testPanic panics in hook when s's request asks for it with
// testPanicHeader: the tests of a panic inside Envoy.
func testPanic(hook string, s *stream) {
	if s == nil || s.dead {
		return
	}
	if v, ok := s.ds.HeaderView(dynmod.RequestHeaders, testPanicHeader); ok && v == hook {
		panic("sluicetest: a panic asked for in " + hook)
	}
}
