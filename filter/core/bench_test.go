package core

import "testing"

// BenchmarkPrecheckRejectionNative runs the path the Wasm benchmark
// measures, natively, with a fake host: a request the precheck rejects.
func BenchmarkPrecheckRejectionNative(b *testing.B) {
	reject := newTestbed(b, testConfig).rejectedStream()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		reject()
	}
}
