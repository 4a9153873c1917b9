//go:build !sluicetest

package main

// The test hooks of the sluicetest build (testhooks_sluicetest.go): in
// this build they do nothing, and cost nothing once inlined.

// testPanic would panic in hook when s's request asks for it.
func testPanic(hook string, s *stream) {}

// testKeepsHooks would keep a hook a request asks to panic in.
func testKeepsHooks(s *stream) bool { return false }

// testClock would read the clock for testHookTime.
func testClock() int64 { return 0 }

// testHookTime would count the time since start in the hooks' histogram.
func testHookTime(start int64) {}

// testReport would answer a request for the runtime's report.
func testReport(s *stream) bool { return false }
