//go:build !sluicetest

package main

// testPanic panics in builds with the sluicetest tag when the stream's
// request asks for it (testpanic_sluicetest.go); in this build it does
// nothing.
func testPanic(hook string, s *stream) {}
