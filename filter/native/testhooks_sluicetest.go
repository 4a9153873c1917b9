//go:build sluicetest

package main

import (
	"time"

	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
	"github.com/sluicehq/sluice/filter/native/internal/gostats"
)

// The test hooks of the sluicetest build, for the tests and measurements
// of the module inside Envoy (testhooks.go has their empty twins):
//   - a request whose testPanicHeader names a hook (request_headers,
//     answer, response_headers) makes the host panic there, the hook not
//     skipped;
//   - the request headers hook's time on the workers is counted, and a
//     request with testReportHeader is answered with the Go runtime's
//     report (package gostats): what bench-envoy -runtime reads.

// testReportHeader asks for the runtime's report.
const testReportHeader = "x-sluice-test-runtime"

// hookTimes is the request headers hook's time on the workers.
var hookTimes gostats.Histogram

// testPanic panics in hook when s's request asks for it with
// testPanicHeader.
func testPanic(hook string, s *stream) {
	if s == nil || s.dead {
		return
	}
	if v, ok := s.ds.Headers(dynmod.RequestHeaders).View(testPanicHeader); ok && v == hook {
		panic("sluicetest: a panic asked for in " + hook)
	}
}

// testKeepsHooks reports whether s's request asks for a panic in a hook
// the module would otherwise skip (skipUnread): the response headers
// hook, when the core has nothing to add.
func testKeepsHooks(s *stream) bool {
	v, ok := s.ds.Headers(dynmod.RequestHeaders).View(testPanicHeader)
	return ok && v == "response_headers"
}

// testClock reads the monotonic clock.
func testClock() int64 { return int64(time.Since(epoch)) }

// testHookTime counts the time since start.
func testHookTime(start int64) { hookTimes.Add(time.Duration(testClock() - start)) }

// testReport answers a request that asks for the runtime's report, and
// reports whether it did. It runs before the hook takes its worker's lock:
// a local reply may end the stream at once.
func testReport(s *stream) bool {
	if _, ok := s.ds.Headers(dynmod.RequestHeaders).View(testReportHeader); !ok {
		return false
	}
	s.ds.SendReply(200, []dynmod.Header{{Name: "content-type", Value: "application/json"}}, gostats.Report(&hookTimes), "sluice_test_runtime")
	return true
}
