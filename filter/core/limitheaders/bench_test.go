package limitheaders

import "testing"

// BenchmarkFormat measures the headers of a 429.
func BenchmarkFormat(b *testing.B) {
	ps := []Policy{{Name: "api_key.method", Quota: 10, Window: 1e9, Reset: 3e9}}
	buf := make([]byte, 0, 256)
	for i := 0; i < b.N; i++ {
		buf = AppendPolicy(buf[:0], ps)
		buf = AppendRateLimit(buf, ps)
		buf = AppendRetryAfter(buf, 3e9)
	}
}
