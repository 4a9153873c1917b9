package ratelimitenv

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/valuecheck"
)

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
func (e *Env) valueProblems(getenv func(string) string) []error {
	var errs []error
	bad := func(name, problem string) {
		if problem != "" {
			errs = append(errs, fmt.Errorf("$%s=%q: %s", name, getenv(name), problem))
		}
	}
	bad("NEAR_LIMIT_RATIO", valuecheck.Ratio(e.nearLimitRatio, 0, 1, true))
	bad("TRACING_SAMPLING_RATE", valuecheck.Ratio(e.tracing.samplingRate, 0, 1, false))
	bad("HOST", valuecheck.Host(e.host, true))
	bad("DEBUG_HOST", valuecheck.Host(e.debugHost, true))
	bad("GRPC_HOST", valuecheck.Host(e.grpcHost, true))
	if e.usePrometheus {
		bad("PROMETHEUS_ADDR", valuecheck.ListenAddr(e.prometheusAddr))
	}
	if v := getenv("SLUICE_POLICY_ADDR"); v != "" {
		bad("SLUICE_POLICY_ADDR", valuecheck.ListenAddr(v))
	}
	if e.tracing.enabled {
		for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
			if v := getenv(name); v != "" {
				bad(name, valuecheck.EndpointURL(v))
			}
		}
	}
	if e.configType != configTypeXDS {
		return errs
	}
	x := &e.xds
	bad("CONFIG_GRPC_XDS_SERVER_URL", valuecheck.GRPCTarget(x.serverURL))
	bad("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", valuecheck.Ratio(x.backoff.RandomFactor, 0, 1, false))
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
		p := valuecheck.HeaderName(k)
		if p == "" {
			p = valuecheck.HeaderValue(k, x.headers[k])
		}
		bad("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", p)
	}
	for _, k := range slices.Sorted(maps.Keys(x.nodeMetadata)) {
		p := valuecheck.Text(k)
		if p == "" {
			p = valuecheck.Text(x.nodeMetadata[k])
		}
		bad("CONFIG_GRPC_XDS_NODE_METADATA", p)
	}
	return errs
}

// ListenerVars names, for an error of server.New, the variables that gave
// the address it could not listen on (taken by another process, or not
// this host's): the server names the listener by its role.
func (e *Env) ListenerVars(err error) error {
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
