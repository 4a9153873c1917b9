package ratelimitenv

import (
	"strings"
	"testing"
)

// TestRatelimitEnvValues: envoyproxy/ratelimit values that parse but
// cannot work are refused at the start, each error naming its variable;
// good values of the same variables pass.
func TestRatelimitEnvValues(t *testing.T) {
	xds := []string{"CONFIG_TYPE", "GRPC_XDS_SOTW"}
	for _, tc := range []struct {
		env  []string
		want string // "" for a good value
	}{
		{[]string{"NEAR_LIMIT_RATIO", "NaN"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"NEAR_LIMIT_RATIO", "+Inf"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"NEAR_LIMIT_RATIO", "0"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"NEAR_LIMIT_RATIO", "x"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"NEAR_LIMIT_RATIO", "1"}, ""},
		{[]string{"TRACING_SAMPLING_RATE", "NaN"}, "$TRACING_SAMPLING_RATE"},
		{[]string{"TRACING_SAMPLING_RATE", "-Inf"}, "$TRACING_SAMPLING_RATE"},
		{[]string{"TRACING_SAMPLING_RATE", "0"}, ""},
		{append(xds, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "NaN"), "$XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
		{append(xds, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "1.5"), "$XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
		{append(xds, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0"), ""},
		{append(xds, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "-1s"), "$XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"},
		{append(xds, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2562047h"), "$XDS_CLIENT_BACKOFF_MAX_INTERVAL"},
		{append(xds, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1"), "$XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"},
		{append(xds, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "4611686018427387904"), "$XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"},
		{append(xds, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "4194304"), ""},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "127.0.0.1:99999"), "$CONFIG_GRPC_XDS_SERVER_URL"},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "::::"), "$CONFIG_GRPC_XDS_SERVER_URL"},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "eg server:18000"), "$CONFIG_GRPC_XDS_SERVER_URL"},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "xds:///eg"), "$CONFIG_GRPC_XDS_SERVER_URL"},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001"), ""},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "dns:///eg:18000"), ""},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "[::1]:18000"), ""},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "unix:///run/xds.sock"), ""},
		{append(xds, "CONFIG_GRPC_XDS_SERVER_URL", "eg"), ""},
		{append(xds, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x token:v"), "$CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{append(xds, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x\x01:v"), "$CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{append(xds, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:v\x7f"), "$CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{append(xds, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "grpc-timeout:1S"), "$CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
		{append(xds, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "Authorization:Bearer abc,x-team=a"), ""},
		{append(xds, "CONFIG_GRPC_XDS_NODE_METADATA", "zone:\xff\xfe"), "$CONFIG_GRPC_XDS_NODE_METADATA"},
		{append(xds, "CONFIG_GRPC_XDS_NODE_METADATA", "zone:eu-west-1,team=é"), ""},
		// Without CONFIG_TYPE=GRPC_XDS_SOTW the xDS variables are not read.
		{[]string{"CONFIG_GRPC_XDS_SERVER_URL", "::::"}, ""},
		{[]string{"HOST", "::::"}, "$HOST"},
		{[]string{"HOST", "a b"}, "$HOST"},
		{[]string{"DEBUG_HOST", "host\x00"}, "$DEBUG_HOST"},
		{[]string{"GRPC_HOST", "[::1]"}, "$GRPC_HOST"},
		{[]string{"GRPC_HOST", "::"}, ""},
		{[]string{"HOST", "ratelimit.default.svc"}, ""},
		{[]string{"USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", "::::"}, "$PROMETHEUS_ADDR"},
		{[]string{"USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", ":99999"}, "$PROMETHEUS_ADDR"},
		{[]string{"USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", ":9090"}, ""},
		{[]string{"SLUICE_POLICY_ADDR", "127.0.0.1:65536"}, "$SLUICE_POLICY_ADDR"},
		{[]string{"TRACING_ENABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:99999"}, "$OTEL_EXPORTER_OTLP_ENDPOINT"},
		{[]string{"TRACING_ENABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4318"}, "$OTEL_EXPORTER_OTLP_ENDPOINT"},
		{[]string{"TRACING_ENABLED", "true", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "::::"}, "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{[]string{"TRACING_ENABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318"}, ""},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "::::"}, "$REDIS_URL"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "127.0.0.1:99999"}, "$REDIS_URL"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://:secret@redis:6379/0"}, "$REDIS_URL"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "cluster", "REDIS_URL", "a:1,b:0"}, "$REDIS_URL"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "sentinel", "REDIS_URL", "mymaster,s1:26379"}, ""},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://redis.default.svc:6379"}, ""},
	} {
		e, err := Read(envOf(tc.env...))
		if err == nil {
			_, _, _, err = e.redis()
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want+"=")):
			t.Errorf("%q: %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
	// A value that does not parse is refused once, as not a number.
	if _, err := Read(envOf("NEAR_LIMIT_RATIO", "x")); err == nil || strings.Count(err.Error(), "NEAR_LIMIT_RATIO") != 1 {
		t.Errorf("NEAR_LIMIT_RATIO=x: %v, want one error", err)
	}
}
