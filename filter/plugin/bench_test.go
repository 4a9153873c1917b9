package plugin

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
	tb.host.current = id
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tb.vm.OnContextCreate(id, rootID)
		tb.vm.OnRequestHeaders(id, 3, true)
		tb.vm.OnDelete(id)
	}
}
