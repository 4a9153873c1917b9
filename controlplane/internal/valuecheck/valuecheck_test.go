package valuecheck

import (
	"math"
	"testing"
)

// TestChecks: each check passes good values ("") and says why of bad ones.
func TestChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  string
		bad  bool
	}{
		{"ratio 0.8", Ratio(0.8, 0, 1, true), false},
		{"ratio 0, open below", Ratio(0, 0, 1, true), true},
		{"ratio 0, closed below", Ratio(0, 0, 1, false), false},
		{"ratio NaN", Ratio(math.NaN(), 0, 1, false), true},
		{"ratio 1.5", Ratio(1.5, 0, 1, false), true},
		{"host name", Host("redis-0.redis", false), false},
		{"host IPv6", Host("::1", false), false},
		{"host empty, every interface", Host("", true), false},
		{"host empty", Host("", false), true},
		{"host with a space", Host("a b", false), true},
		{"port 0 listens", Port("0", true), false},
		{"port 0 dials", Port("0", false), true},
		{"port 65536", Port("65536", true), true},
		{"listen :8081", ListenAddr(":8081"), false},
		{"listen without port", ListenAddr("127.0.0.1"), true},
		{"dial host:port", DialAddr("10.0.0.2:6380", false), false},
		{"dial bare host, port optional", DialAddr("xds", true), false},
		{"dial bare host", DialAddr("xds", false), true},
		{"gRPC target dns", GRPCTarget("dns:///xds.internal:18000"), false},
		{"gRPC target unix", GRPCTarget("unix:/run/xds.sock"), false},
		{"gRPC target scheme", GRPCTarget("http://xds:18000"), true},
		{"gRPC target port", GRPCTarget("127.0.0.1:99999"), true},
		{"endpoint URL", EndpointURL("https://otel:4318"), false},
		{"endpoint scheme", EndpointURL("ftp://otel:4318"), true},
		{"header name", HeaderName("x-tenant"), false},
		{"header name grpc-", HeaderName("grpc-timeout"), true},
		{"header value", HeaderValue("x-tenant", "acme"), false},
		{"header value newline", HeaderValue("x-tenant", "a\nb"), true},
		{"header value -bin", HeaderValue("x-key-bin", "\x00"), false},
		{"text", Text("zone-a"), false},
		{"text not UTF-8", Text("\xff"), true},
	} {
		if (tc.got != "") != tc.bad {
			t.Errorf("%s: %q, want bad=%v", tc.name, tc.got, tc.bad)
		}
	}
}
