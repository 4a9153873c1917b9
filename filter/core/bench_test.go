package core

import "testing"

// BenchmarkPrecheckRejectionNative runs the path the Wasm benchmark
// measures, natively, with a fake host: a request the precheck rejects.
func BenchmarkPrecheckRejectionNative(b *testing.B) {
	tb := newTestbed(b, testConfig)
	tb.request(apiRequest, "10.0.0.9:1")
	tb.deliver(overLimitAnswer(b, 600000))
	tb.host.quiet = true
	id := uint32(5000)
	tb.host.headers[id] = apiRequest
	tb.host.remote[id] = "10.0.0.9:1"
	b.ReportAllocs()
	b.ResetTimer()
	s := &fakeStream{h: tb.host, id: id}
	for i := 0; i < b.N; i++ {
		x := tb.w.Open(s)
		tb.w.RequestHeaders(x)
		tb.w.Close(x)
	}
}
