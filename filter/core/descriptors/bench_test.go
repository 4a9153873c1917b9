package descriptors

import "testing"

// BenchmarkBuild measures building two descriptors from a request.
func BenchmarkBuild(b *testing.B) {
	c := mustConfig(b, `[{"actions":[{"remote_address":{}}]},{"actions":[{"request_headers":{"header_name":"x-api-key","descriptor_key":"api_key"}},{"method":{}}]}]`)
	req := &fakeRequest{headers: map[string]string{":method": "GET", "x-api-key": "k1"}, remote: "198.51.100.4:5000"}
	var s Set
	var key []byte
	for i := 0; i < b.N; i++ {
		s.Build(c.RateLimits, req)
		for j := range s.Descriptors {
			key = AppendKey(key[:0], &s.Descriptors[j])
		}
	}
}

// BenchmarkHostIP measures extracting the IP of a downstream address.
func BenchmarkHostIP(b *testing.B) {
	for i := 0; i < b.N; i++ {
		HostIP("198.51.100.4:5000")
	}
}
