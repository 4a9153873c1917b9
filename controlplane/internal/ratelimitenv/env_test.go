package ratelimitenv

import (
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
)

// envOf returns a getenv holding the pairs of kv.
func envOf(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestRatelimitEnvDefaults: with nothing set, envoyproxy/ratelimit's
// defaults.
func TestRatelimitEnvDefaults(t *testing.T) {
	e, err := Read(envOf())
	if err != nil {
		t.Fatal(err)
	}
	if addr(e.host, e.port) != "0.0.0.0:8080" || addr(e.grpcHost, e.grpcPort) != "0.0.0.0:8081" || addr(e.debugHost, e.debugPort) != "0.0.0.0:6070" {
		t.Errorf("ports: %d %d %d", e.port, e.grpcPort, e.debugPort)
	}
	if e.configType != configTypeFile || e.runtimeDir() != "/srv/runtime_data/current/config" || !e.runtimeWatch ||
		e.xds.nodeID != "default" || e.xds.serverURL != "localhost:18000" || e.xds.backoff.Initial != 10*time.Second ||
		e.logLevel != "warn" || e.prometheusAddr != ":9090" || e.tracing.protocol != "http" {
		t.Errorf("defaults: %+v", e)
	}
	if mode, _, _, _ := e.redis(); mode != "memory" {
		t.Errorf("no REDIS_URL: mode %q, want memory", mode)
	}
}

// TestRatelimitEnvRedis maps REDIS_TYPE and REDIS_URL.
func TestRatelimitEnvRedis(t *testing.T) {
	for _, tc := range []struct {
		typ, url, mode, master string
		addrs                  []string
		err                    bool
	}{
		{"", "localhost:6379", "standalone", "", []string{"localhost:6379"}, false},
		{"", "redis://r:6379", "standalone", "", []string{"r:6379"}, false},
		{"single", "a:1,b:2", "", "", nil, true},
		{"CLUSTER", "a:1, b:2,c:3", "cluster", "", []string{"a:1", "b:2", "c:3"}, false},
		{"sentinel", "mymaster,s1:26379,s2:26379", "sentinel", "mymaster", []string{"s1:26379", "s2:26379"}, false},
		{"SENTINEL", "s1:26379", "", "", nil, true},
	} {
		e, err := Read(envOf("REDIS_TYPE", tc.typ, "REDIS_URL", tc.url, "REDIS_SOCKET_TYPE", "tcp"))
		if err != nil {
			t.Fatal(err)
		}
		mode, addrs, master, err := e.redis()
		if (err != nil) != tc.err || mode != tc.mode || master != tc.master || !slices.Equal(addrs, tc.addrs) {
			t.Errorf("%s %q: %q %q %q %v", tc.typ, tc.url, mode, addrs, master, err)
		}
	}
	e, _ := Read(envOf("REDIS_AUTH", "user:p:w"))
	if u, p := e.redisUser(); u != "user" || p != "p:w" {
		t.Errorf("REDIS_AUTH user:p:w: %q %q", u, p)
	}
	e, _ = Read(envOf("REDIS_AUTH", "secret"))
	if u, p := e.redisUser(); u != "" || p != "secret" {
		t.Errorf("REDIS_AUTH secret: %q %q", u, p)
	}
}

// TestRatelimitEnvClientCA: which CA checks Envoy's client certificate.
func TestRatelimitEnvClientCA(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"}, "/certs/ca.crt"},
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt", "GRPC_CLIENT_TLS_CACERT", "/other.crt"}, "/other.crt"},
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt", "SLUICE_IGNORE_GRPC_SERVER_TLS_CA_CERT", "true"}, ""},
		{[]string{"GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"}, ""},
	} {
		env := append(tc.env, "GRPC_SERVER_TLS_CERT", "c", "GRPC_SERVER_TLS_KEY", "k")
		e, err := Read(envOf(env...))
		if err != nil {
			t.Fatal(err)
		}
		if got := e.clientCA(); got != tc.want {
			t.Errorf("%v: client CA %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestRatelimitEnvErrors: bad values are refused, naming the variable;
// unsupported ones are listed with why.
func TestRatelimitEnvErrors(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"CONFIG_TYPE", "GRPC_XDS_DELTA"}, "$CONFIG_TYPE"},
		{[]string{"PORT", "eighty"}, "$PORT"},
		{[]string{"BACKEND_TYPE", "memcache"}, "$BACKEND_TYPE"},
		{[]string{"REDIS_URL", "/var/run/redis.sock"}, "$REDIS_SOCKET_TYPE"},
		{[]string{"GRPC_SERVER_USE_TLS", "true"}, "$GRPC_SERVER_TLS_CERT"},
		{[]string{"TRACING_SAMPLING_RATE", "2"}, "$TRACING_SAMPLING_RATE"},
		{[]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10"}, "$XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"},
		{[]string{"FORCE_START_WITHOUT_INITIAL_CONFIG", "yes please"}, "$FORCE_START_WITHOUT_INITIAL_CONFIG"},
	} {
		_, err := Read(envOf(tc.env...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
	got := unsupportedOf(t, envOf("SHADOW_MODE", "true", "USE_STATSD", "false", "STATSD_PORT", "9125", "RUNTIME_IGNOREDOTFILES", "1", "PORT", "1"))
	if len(got) != 2 || !strings.HasPrefix(got[0], "STATSD_PORT=9125: ") || !strings.HasPrefix(got[1], "SHADOW_MODE=true: ") {
		t.Errorf("unsupported: %q", got)
	}
	// A value compared as a string: only another path than sluice's is logged.
	if got := unsupportedOf(t, envOf("PROMETHEUS_PATH", "/stats")); len(got) != 1 || got[0] != "PROMETHEUS_PATH=/stats: the metrics are served at /metrics" {
		t.Errorf("PROMETHEUS_PATH=/stats: unsupported %q", got)
	}
	if got := unsupportedOf(t, envOf("PROMETHEUS_PATH", "/metrics")); len(got) != 0 {
		t.Errorf("PROMETHEUS_PATH=/metrics: unsupported %q", got)
	}
}

// TestHealthcheck: 200 "OK" while ready, 500 with the reason otherwise
// (starting, draining), as envoyproxy/ratelimit's /healthcheck.
func TestHealthcheck(t *testing.T) {
	for _, tc := range []struct {
		ok   bool
		why  string
		code int
		body string
	}{
		{true, "ready", 200, "OK"},
		{false, "not serving (starting or draining)", 500, "not serving (starting or draining)\n"},
	} {
		h := healthHandler(func() (bool, string) { return tc.ok, tc.why })
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthcheck", nil))
		if rec.Code != tc.code || rec.Body.String() != tc.body {
			t.Errorf("ready %v: %d %q, want %d %q", tc.ok, rec.Code, rec.Body.String(), tc.code, tc.body)
		}
	}
}

// unsupportedOf reads env and returns its Unsupported.
func unsupportedOf(t *testing.T, env func(string) string) []string {
	t.Helper()
	e, err := Read(env)
	if err != nil {
		t.Fatal(err)
	}
	return e.Unsupported()
}

// TestCalendarMonths: USE_CALENDAR_MONTH_RATE_LIMIT=true makes MONTH limits
// count UTC calendar months (the server's CalendarMonths); unset or false
// leaves a month 30 days from the epoch; another value is refused, named.
func TestCalendarMonths(t *testing.T) {
	utc, err := calendar.Of("UTC", algorithms.UnitMonth)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		env  []string
		want *calendar.Calendar
		err  string
	}{
		{nil, nil, ""},
		{[]string{"USE_CALENDAR_MONTH_RATE_LIMIT", "false"}, nil, ""},
		{[]string{"USE_CALENDAR_MONTH_RATE_LIMIT", "true"}, utc, ""},
		{[]string{"USE_CALENDAR_MONTH_RATE_LIMIT", "1"}, utc, ""},
		{[]string{"USE_CALENDAR_MONTH_RATE_LIMIT", "monthly"}, nil, `$USE_CALENDAR_MONTH_RATE_LIMIT="monthly": not a boolean`},
	} {
		e, err := Read(envOf(tc.env...))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error holding %q", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.env, err)
		}
		cfg, err := e.Config(quiet)
		if err != nil || cfg.CalendarMonths != tc.want {
			t.Errorf("%q: CalendarMonths %v, %v; want %v", tc.env, cfg.CalendarMonths, err, tc.want)
		}
	}
}
