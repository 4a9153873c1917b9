package main

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Checks of the values of flags and of envoyproxy/ratelimit's variables
// that parse but cannot work: NaN, an address no listener or dialer takes,
// a header gRPC refuses to send. Each returns "" for a good value, else why
// not, for an error that names the flag or variable. Refusing them at the
// start (exit status 2) beats a process that serves without what was asked
// for, or retries for ever.

// ratioProblem says why x is not a finite number in [lo, hi] (above lo
// when openLo).
func ratioProblem(x, lo, hi float64, openLo bool) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "not a finite number"
	case openLo && x <= lo:
		return fmt.Sprintf("use a number above %v, at most %v", lo, hi)
	case x < lo || x > hi:
		return fmt.Sprintf("use a number from %v to %v", lo, hi)
	}
	return ""
}

// hostProblem says why host is neither empty (every interface, when
// emptyOK), an IP address nor a DNS name.
func hostProblem(host string, emptyOK bool) string {
	switch {
	case host == "":
		if emptyOK {
			return ""
		}
		return "no host"
	case strings.ContainsRune(host, ':') || strings.ContainsRune(host, '%'):
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Sprintf("%q is not an IP address", host)
		}
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if len(host) > 253 {
		return "a host name of more than 253 bytes"
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 {
			return fmt.Sprintf("%q is not a host name (empty label, or one longer than 63 bytes)", host)
		}
		for i := 0; i < len(label); i++ {
			switch c := label[i]; {
			case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			default:
				return fmt.Sprintf("%q is not a host name or an IP address", host)
			}
		}
	}
	return ""
}

// portProblem says why p is not a port number: 1 to 65535, or 0 (any free
// port, for a listener) when zeroOK.
func portProblem(p string, zeroOK bool) string {
	n, err := strconv.Atoi(p)
	switch {
	case err != nil:
		return fmt.Sprintf("port %q is not a number", p)
	case n < 0 || n > 65535 || (n == 0 && !zeroOK):
		return fmt.Sprintf("port %d is out of range (1 to 65535)", n)
	}
	return ""
}

// listenAddrProblem says why a is not host:port for a listener (the host
// may be empty; the port may be 0).
func listenAddrProblem(a string) string {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Sprintf("not host:port (%v)", strings.TrimPrefix(err.Error(), "address "+a+": "))
	}
	if p := hostProblem(host, true); p != "" {
		return p
	}
	return portProblem(port, true)
}

// dialAddrProblem says why a is not host:port to dial; with portOptional
// a bare host passes too.
func dialAddrProblem(a string, portOptional bool) string {
	host, port, err := net.SplitHostPort(a)
	bare := !strings.Contains(a, ":") || strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]")
	switch {
	case err != nil && portOptional && bare:
		return hostProblem(strings.Trim(a, "[]"), false)
	case err != nil:
		return fmt.Sprintf("not host:port (%v)", strings.TrimPrefix(err.Error(), "address "+a+": "))
	}
	if p := hostProblem(host, false); p != "" {
		return p
	}
	return portProblem(port, false)
}

// grpcTargetProblem says why t is not a gRPC target sluice can dial:
// host[:port] (grpc-go's default port is 443), dns:[//authority]/host[:port],
// passthrough:///host:port, or unix:path.
func grpcTargetProblem(t string) string {
	scheme, rest, ok := strings.Cut(t, ":")
	switch {
	case !ok || strings.ContainsAny(scheme, ".[") || !strings.HasPrefix(rest, "/") && scheme != "unix" && scheme != "unix-abstract":
		return dialAddrProblem(t, true) // host:port, [v6]:port or a bare host
	case scheme == "unix" || scheme == "unix-abstract":
		if strings.Trim(rest, "/") == "" {
			return "a unix target without a path"
		}
		return ""
	case scheme != "dns" && scheme != "passthrough":
		return fmt.Sprintf("scheme %q: use host:port, dns:///host:port, passthrough:///host:port or unix:path", scheme)
	}
	u, err := url.Parse(t)
	if err != nil {
		return err.Error()
	}
	return dialAddrProblem(strings.TrimPrefix(u.Path, "/"), scheme == "dns")
}

// endpointURLProblem says why an OTLP endpoint is neither an http(s) URL
// with a good host and port nor a bare host:port.
func endpointURLProblem(e string) string {
	if !strings.Contains(e, "://") {
		return dialAddrProblem(e, false)
	}
	u, err := url.Parse(e)
	switch {
	case err != nil:
		return err.Error()
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("scheme %q: use http or https", u.Scheme)
	}
	return dialAddrProblem(u.Host, true)
}

// headerNameProblem says why name is not a gRPC metadata key a client may
// send: letters, digits, '-', '_' and '.' (grpc-go lowercases it), not one
// of gRPC's own (grpc-*).
func headerNameProblem(name string) string {
	if name == "" {
		return "an empty header name"
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Sprintf("header name %q: only letters, digits, '-', '_' and '.'", name)
		}
	}
	if strings.HasPrefix(strings.ToLower(name), "grpc-") {
		return fmt.Sprintf("header name %q: grpc-* headers are gRPC's own", name)
	}
	return ""
}

// headerValueProblem says why v cannot be sent as the value of a text
// (not -bin) gRPC header: printable ASCII only.
func headerValueProblem(name, v string) string {
	if strings.HasSuffix(strings.ToLower(name), "-bin") {
		return ""
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return fmt.Sprintf("header %q: its value holds a byte that is not printable ASCII (0x%02x at %d)", name, v[i], i)
		}
	}
	return ""
}

// textProblem says why s is not valid UTF-8 (protobuf strings must be).
func textProblem(s string) string {
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%q is not valid UTF-8", s)
	}
	return ""
}

// Bounds of envoyproxy/ratelimit's XDS_CLIENT_* values.
const (
	// minXDSMsgSize and maxXDSMsgSize bound XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES:
	// a smaller limit refuses every real response, and a response larger
	// than the policy set's bounds allow is refused anyway (xdsconfig).
	minXDSMsgSize = 4 << 10
	maxXDSMsgSize = 64 << 20
	// maxXDSBackoff bounds XDS_CLIENT_BACKOFF_*_INTERVAL: a retry later
	// than this is no retry.
	maxXDSBackoff = 24 * time.Hour
)

// valueProblems checks the values of e that parsed but cannot work; each
// error names its variable. getenv gives the values as written.
func (e *rlEnv) valueProblems(getenv func(string) string) []error {
	var errs []error
	bad := func(name, problem string) {
		if problem != "" {
			errs = append(errs, fmt.Errorf("$%s=%q: %s", name, getenv(name), problem))
		}
	}
	bad("NEAR_LIMIT_RATIO", ratioProblem(e.nearLimitRatio, 0, 1, true))
	bad("TRACING_SAMPLING_RATE", ratioProblem(e.tracing.samplingRate, 0, 1, false))
	bad("HOST", hostProblem(e.host, true))
	bad("DEBUG_HOST", hostProblem(e.debugHost, true))
	bad("GRPC_HOST", hostProblem(e.grpcHost, true))
	if e.usePrometheus {
		bad("PROMETHEUS_ADDR", listenAddrProblem(e.prometheusAddr))
	}
	if v := getenv("SLUICE_POLICY_ADDR"); v != "" {
		bad("SLUICE_POLICY_ADDR", listenAddrProblem(v))
	}
	if e.tracing.enabled {
		for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
			if v := getenv(name); v != "" {
				bad(name, endpointURLProblem(v))
			}
		}
	}
	if e.configType != configTypeXDS {
		return errs
	}
	x := &e.xds
	bad("CONFIG_GRPC_XDS_SERVER_URL", grpcTargetProblem(x.serverURL))
	bad("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", ratioProblem(x.backoff.RandomFactor, 0, 1, false))
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", x.backoff.Initial}, {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", x.backoff.Max}} {
		if d.d <= 0 || d.d > maxXDSBackoff {
			bad(d.name, fmt.Sprintf("use a duration above 0, at most %v", maxXDSBackoff))
		}
	}
	if x.maxMsgSize < minXDSMsgSize || x.maxMsgSize > maxXDSMsgSize {
		bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", fmt.Sprintf("use %d (4 KiB) to %d (64 MiB) bytes", minXDSMsgSize, maxXDSMsgSize))
	}
	for _, k := range slices.Sorted(maps.Keys(x.headers)) {
		p := headerNameProblem(k)
		if p == "" {
			p = headerValueProblem(k, x.headers[k])
		}
		bad("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", p)
	}
	for _, k := range slices.Sorted(maps.Keys(x.nodeMetadata)) {
		p := textProblem(k)
		if p == "" {
			p = textProblem(x.nodeMetadata[k])
		}
		bad("CONFIG_GRPC_XDS_NODE_METADATA", p)
	}
	return errs
}

// listenerVars names, for an error of server.New, the variables that gave
// the address it could not listen on (taken by another process, or not
// this host's): the server names the listener by its role.
func (e *rlEnv) listenerVars(err error) error {
	ls := []struct{ role, addr, vars string }{
		{"healthcheck", addr(e.host, e.port), "$HOST, $PORT"},
		{"debug", addr(e.debugHost, e.debugPort), "$DEBUG_HOST, $DEBUG_PORT"},
		{"gRPC", addr(e.grpcHost, e.grpcPort), "$GRPC_HOST, $GRPC_PORT"},
		{"HTTP", e.prometheusAddr, "$PROMETHEUS_ADDR"},
	}
	for _, l := range ls {
		if strings.Contains(err.Error(), " "+l.role+" address "+l.addr+":") {
			return fmt.Errorf("%s (%s): %w", l.vars, l.addr, err)
		}
	}
	return err
}

// maxSettleTTL bounds -settle-dedupe-ttl: a settlement is retried for
// seconds to minutes, and a token remembered longer only costs memory.
const maxSettleTTL = 24 * time.Hour

// valueProblems checks the flags' values that parsed but cannot work; each
// error names the flag and its variable (envOf).
func (c *config) valueProblems(envOf map[string]string) []error {
	var errs []error
	bad := func(flag string, value any, problem string) {
		if problem != "" {
			errs = append(errs, fmt.Errorf("-%s ($%s) %v: %s", flag, envOf[flag], value, problem))
		}
	}
	bad("near-limit-ratio", c.nearLimitRatio, ratioProblem(c.nearLimitRatio, 0, 1, true))
	if math.IsNaN(c.trip.Ratio) {
		bad("degrade-failure-ratio", c.trip.Ratio, "not a number (above 1 turns the ratio off)")
	}
	for _, l := range []struct{ flag, addr string }{
		{"grpc-addr", c.grpcAddr}, {"http-addr", c.httpAddr}, {"policy-addr", c.policyAddr}, {"rlqs-addr", c.rlqsAddr},
	} {
		if l.addr != "" || l.flag == "grpc-addr" || l.flag == "http-addr" {
			bad(l.flag, strconv.Quote(l.addr), listenAddrProblem(l.addr))
		}
	}
	for _, a := range c.redisAddrs {
		bad("redis-addrs", strconv.Quote(a), dialAddrProblem(a, false))
	}
	if c.redisDB < 0 {
		bad("redis-db", c.redisDB, "a Redis database number is 0 or more")
	}
	if c.settleMaxTokens <= 0 {
		bad("settle-max-tokens", c.settleMaxTokens, "must be positive")
	}
	if c.settleTTL > maxSettleTTL {
		bad("settle-dedupe-ttl", c.settleTTL, fmt.Sprintf("at most %v", maxSettleTTL))
	}
	return errs
}
