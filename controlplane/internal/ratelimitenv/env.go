// Package ratelimitenv reads envoyproxy/ratelimit's environment, for the
// control plane run as /bin/ratelimit (Envoy Gateway's ratelimit
// Deployment), and returns what it asks for in sluice's terms: the server's
// configuration (the same server.Config sluice-controlplane's flags make),
// the policy files, the xDS configuration source, tracing, and the
// health and debug endpoints. A variable whose value cannot work stops the
// start, named; one sluice does not honour is listed (Unsupported) with why.
package ratelimitenv

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/tracing"
	"github.com/sluicehq/sluice/controlplane/internal/valuecheck"
	"github.com/sluicehq/sluice/controlplane/internal/xdsconfig"
)

// The values of CONFIG_TYPE.
const (
	configTypeFile = "FILE"
	configTypeXDS  = "GRPC_XDS_SOTW"
)

// Env is envoyproxy/ratelimit's environment, as sluice uses it. Defaults
// are theirs (src/settings/settings.go).
type Env struct {
	getenv func(string) string // for the variables read when they are used

	host, debugHost, grpcHost string
	port, debugPort, grpcPort int

	grpcTLS                    bool
	grpcCert, grpcKey          string
	grpcClientCA, grpcSAN      string
	grpcServerCA               string // GRPC_SERVER_TLS_CA_CERT (Envoy Gateway's)
	ignoreServerCA             bool   // SLUICE_IGNORE_GRPC_SERVER_TLS_CA_CERT
	logLevel, logFormat        string
	configType                 string
	forceStart                 bool
	healthyWithConfig          bool
	xds                        xdsEnv
	usePrometheus              bool
	prometheusAddr             string
	runtimeRoot, runtimeSub    string
	runtimeApp                 string
	runtimeWatch               bool
	nearLimitRatio             float64
	calendarMonths             bool // USE_CALENDAR_MONTH_RATE_LIMIT
	backendType                string
	redisSocket, redisType     string
	redisURL                   string
	redisAuth                  string
	redisTLS                   bool
	redisCert, redisKey, redCA string

	tracing tracingEnv
}

// xdsEnv is CONFIG_GRPC_XDS_* and XDS_CLIENT_*.
type xdsEnv struct {
	nodeID, serverURL  string
	nodeMetadata       map[string]string
	headers            map[string]string
	useTLS             bool
	cert, key, ca, san string
	backoff            xdsconfig.Backoff
	maxMsgSize         int
}

// tracingEnv is TRACING_* and OTEL_EXPORTER_OTLP_ENDPOINT.
type tracingEnv struct {
	enabled                      bool
	serviceName, namespace, inst string
	protocol                     string // http or grpc
	samplingRate                 float64
	endpoint                     string
}

// unsupported lists envoyproxy/ratelimit's variables sluice does not honour,
// each with why, and the value that asks for what sluice does anyway
// (USE_STATSD=false, which Envoy Gateway sets; PROMETHEUS_PATH=/metrics);
// any of them set to another value is logged once at start-up.
var unsupported = []struct{ name, why, same string }{
	{"GRPC_UDS", "a Unix socket for the decision port is not supported: use GRPC_HOST and GRPC_PORT", ""},
	{"GRPC_MAX_CONNECTION_AGE", "connections are not aged out; idle ones close after 5 minutes (SLUICE_IDLE_TIMEOUT)", ""},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "connections are not aged out", ""},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "reconnection follows XDS_CLIENT_BACKOFF_* alone", ""},
	{"XDS_CLIENT_BACKOFF_JITTER", "the backoff always spreads its waits by XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "true"},
	{"USE_STATSD", "no statsd: the statistics are Prometheus metrics, served on PROMETHEUS_ADDR with USE_PROMETHEUS=true", "false"},
	{"STATSD_HOST", "no statsd", ""},
	{"STATSD_PORT", "no statsd", ""},
	{"USE_DOG_STATSD", "no statsd", "false"},
	{"USE_DOG_STATSD_MOGRIFIERS", "no statsd", ""},
	{"EXTRA_TAGS", "no statsd tags; Prometheus labels are fixed", ""},
	{"STATS_FLUSH_INTERVAL", "Prometheus is scraped, not flushed", ""},
	{"DISABLE_STATS", "the metrics are always kept (they cost a few atomic adds)", "false"},
	{"PROMETHEUS_MAPPER_YAML", "sluice exports its own metric names (the README's Metrics table maps the statsd names); no mapper is applied", ""},
	{"RUNTIME_IGNOREDOTFILES", "names that start with a dot are always skipped", "true"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "keys expire with their window (PEXPIRE); nothing expires in bulk", ""},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "over-limit keys are remembered by sluice's Wasm filter, in Envoy; the memory store is the rescue limiter", ""},
	{"CACHE_KEY_PREFIX", "keys are sluice:{...}; use another Redis database to keep deployments apart", ""},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "always on: sluice never counts a refused request", "true"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "sluice's headers are the IETF RateLimit ones, per policy (response_headers: true)", "false"},
	{"LIMIT_LIMIT_HEADER", "see LIMIT_RESPONSE_HEADERS_ENABLED", ""},
	{"LIMIT_REMAINING_HEADER", "see LIMIT_RESPONSE_HEADERS_ENABLED", ""},
	{"LIMIT_RESET_HEADER", "see LIMIT_RESPONSE_HEADERS_ENABLED", ""},
	{"REDIS_POOL_SIZE", "go-redis sizes its pool; concurrent checks share script round trips", ""},
	{"REDIS_PIPELINE_WINDOW", "sluice batches concurrent checks into one round trip on its own", ""},
	{"REDIS_PIPELINE_LIMIT", "sluice batches concurrent checks into one round trip on its own", ""},
	{"REDIS_TIMEOUT", "a decision waits SLUICE_DEADLINE (20ms) for Redis, then the memory store answers", ""},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "go-redis waits for a connection within the decision deadline", ""},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "a degraded replica probes Redis every SLUICE_PROBE_INTERVAL and reports it in /readyz and gRPC health", "false"},
	{"REDIS_SENTINEL_AUTH", "the sentinels are reached with REDIS_AUTH's credentials", ""},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "skipping verification would accept any server: set SLUICE_REDIS_TLS_SERVER_NAME to the name in its certificate", "false"},
	{"REDIS_PERSECOND", "one Redis holds every limit", "false"},
	{"REDIS_PERSECOND_URL", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_TYPE", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_SOCKET_TYPE", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_AUTH", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_TLS", "one Redis holds every limit", "false"},
	{"REDIS_PERSECOND_POOL_SIZE", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_TIMEOUT", "one Redis holds every limit", ""},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "one Redis holds every limit", ""},
	{"MEMCACHE_HOST_PORT", "no memcache backend: Redis or the memory store", ""},
	{"MEMCACHE_SRV", "no memcache backend", ""},
	{"MEMCACHE_MAX_IDLE_CONNS", "no memcache backend", ""},
	{"MEMCACHE_SRV_REFRESH", "no memcache backend", ""},
	{"MEMCACHE_TLS", "no memcache backend", "false"},
	{"SHADOW_MODE", "no process-wide shadow mode: set shadow_mode on the descriptors", "false"},
	{"QUOTA_MODE", "not supported by this build: see the README's differences", "false"},
	{"RESPONSE_DYNAMIC_METADATA", "sluice always returns its per-descriptor limits in dynamic_metadata", "true"},
	{"MERGE_DOMAIN_CONFIG", "two configurations of one domain are refused, naming both", "false"},
	{"PROMETHEUS_PATH", "the metrics are served at /metrics", "/metrics"},
}

// Unsupported returns the variables sluice does not honour that are set to
// another value than what sluice does anyway, each with why
// ("name=value: why"): they are to be logged, not refused.
func (e *Env) Unsupported() []string {
	var out []string
	for _, u := range unsupported {
		if v := e.getenv(u.name); v != "" && !sameValue(v, u.same) {
			out = append(out, u.name+"="+v+": "+u.why)
		}
	}
	return out
}

// sameValue reports whether v asks for same ("" never is): the same
// boolean for a switch, else the same string.
func sameValue(v, same string) bool {
	if same == "" {
		return false
	}
	b, err := strconv.ParseBool(same)
	if err != nil {
		return v == same
	}
	a, err := strconv.ParseBool(v)
	return err == nil && a == b
}

// envReader reads typed variables, collecting errors.
type envReader struct {
	getenv func(string) string
	errs   []error
}

func (r *envReader) str(name, def string) string {
	if v := r.getenv(name); v != "" {
		return v
	}
	return def
}

func (r *envReader) num(name string, def int) int {
	return parseEnv(r, name, def, strconv.Atoi, "an integer")
}

func (r *envReader) boolean(name string, def bool) bool {
	return parseEnv(r, name, def, strconv.ParseBool, "a boolean (true or false)")
}

func (r *envReader) float(name string, def float64) float64 {
	return parseEnv(r, name, def, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }, "a number")
}

func (r *envReader) duration(name string, def time.Duration) time.Duration {
	return parseEnv(r, name, def, time.ParseDuration, "a duration (e.g. 10s)")
}

// parseEnv reads $name with parse, or returns def when it is unset or
// empty. A value parse refuses is collected as not being what.
func parseEnv[T any](r *envReader, name string, def T, parse func(string) (T, error), what string) T {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("$%s=%q: not %s", name, v, what))
		return def // so that the value checks do not refuse it twice
	}
	return x
}

// pairs reads "k1:v1,k2=v2" (envconfig's map syntax is k:v; the ratelimit
// README also shows k=v).
func (r *envReader) pairs(name string) map[string]string {
	v := r.getenv(name)
	if v == "" {
		return nil
	}
	m := map[string]string{}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		i := strings.IndexAny(p, ":=")
		if i <= 0 {
			r.errs = append(r.errs, fmt.Errorf("$%s: %q is not key:value", name, p))
			continue
		}
		m[p[:i]] = p[i+1:]
	}
	return m
}

// Read reads envoyproxy/ratelimit's environment: getenv is os.Getenv, or
// a test's. Every value that does not parse, or cannot work, is an error
// naming its variable.
func Read(getenv func(string) string) (*Env, error) {
	r := &envReader{getenv: getenv}
	e := &Env{
		getenv: getenv,
		host:   r.str("HOST", "0.0.0.0"), port: r.num("PORT", 8080),
		debugHost: r.str("DEBUG_HOST", "0.0.0.0"), debugPort: r.num("DEBUG_PORT", 6070),
		grpcHost: r.str("GRPC_HOST", "0.0.0.0"), grpcPort: r.num("GRPC_PORT", 8081),
		grpcTLS:  r.boolean("GRPC_SERVER_USE_TLS", false),
		grpcCert: r.str("GRPC_SERVER_TLS_CERT", ""), grpcKey: r.str("GRPC_SERVER_TLS_KEY", ""),
		grpcClientCA: r.str("GRPC_CLIENT_TLS_CACERT", ""), grpcSAN: r.str("GRPC_CLIENT_TLS_SAN", ""),
		grpcServerCA:      r.str("GRPC_SERVER_TLS_CA_CERT", ""),
		ignoreServerCA:    r.boolean("SLUICE_IGNORE_GRPC_SERVER_TLS_CA_CERT", false),
		logLevel:          strings.ToLower(r.str("LOG_LEVEL", "WARN")),
		logFormat:         strings.ToLower(r.str("LOG_FORMAT", "text")),
		configType:        strings.ToUpper(r.str("CONFIG_TYPE", configTypeFile)),
		forceStart:        r.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false),
		healthyWithConfig: r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false),
		usePrometheus:     r.boolean("USE_PROMETHEUS", false),
		prometheusAddr:    r.str("PROMETHEUS_ADDR", ":9090"),
		runtimeRoot:       r.str("RUNTIME_ROOT", "/srv/runtime_data/current"),
		runtimeSub:        r.str("RUNTIME_SUBDIRECTORY", ""),
		runtimeApp:        r.str("RUNTIME_APPDIRECTORY", "config"),
		runtimeWatch:      r.boolean("RUNTIME_WATCH_ROOT", true),
		nearLimitRatio:    r.float("NEAR_LIMIT_RATIO", 0.8),
		calendarMonths:    r.boolean("USE_CALENDAR_MONTH_RATE_LIMIT", false),
		backendType:       strings.ToLower(r.str("BACKEND_TYPE", "redis")),
		redisSocket:       strings.ToLower(r.str("REDIS_SOCKET_TYPE", "unix")),
		redisType:         strings.ToUpper(r.str("REDIS_TYPE", "SINGLE")),
		redisURL:          r.getenv("REDIS_URL"),
		redisAuth:         r.getenv("REDIS_AUTH"),
		redisTLS:          r.boolean("REDIS_TLS", false),
		redisCert:         r.str("REDIS_TLS_CLIENT_CERT", ""), redisKey: r.str("REDIS_TLS_CLIENT_KEY", ""),
		redCA: r.str("REDIS_TLS_CACERT", ""),
	}
	e.xds = xdsEnv{
		nodeID:       r.str("CONFIG_GRPC_XDS_NODE_ID", "default"),
		serverURL:    r.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
		nodeMetadata: r.pairs("CONFIG_GRPC_XDS_NODE_METADATA"),
		headers:      r.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
		useTLS:       r.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false),
		cert:         r.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""), key: r.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""),
		ca: r.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""), san: r.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ""),
		backoff: xdsconfig.Backoff{
			Initial:      r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", xdsconfig.DefaultBackoffInitial),
			Max:          r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", xdsconfig.DefaultBackoffMax),
			RandomFactor: r.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", xdsconfig.DefaultBackoffRandomFactor),
		},
		maxMsgSize: r.num("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", xdsconfig.DefaultMaxMsgSize),
	}
	e.tracing = tracingEnv{
		enabled:      r.boolean("TRACING_ENABLED", false),
		serviceName:  r.str("TRACING_SERVICE_NAME", "RateLimit"),
		namespace:    r.str("TRACING_SERVICE_NAMESPACE", ""),
		inst:         r.str("TRACING_SERVICE_INSTANCE_ID", ""),
		protocol:     strings.ToLower(r.str("TRACING_EXPORTER_PROTOCOL", "http")),
		samplingRate: r.float("TRACING_SAMPLING_RATE", 1),
		endpoint:     r.str("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
	}
	errs := r.errs
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(e.configType != configTypeFile && e.configType != configTypeXDS, "$CONFIG_TYPE=%q: use FILE or GRPC_XDS_SOTW", e.configType)
	check(e.backendType != "redis", "$BACKEND_TYPE=%q: sluice keeps its counters in Redis (or, without REDIS_URL, in memory); memcache is not supported", e.backendType)
	check(e.redisURL != "" && e.redisSocket != "tcp", "$REDIS_SOCKET_TYPE=%q: only tcp is supported (set REDIS_SOCKET_TYPE=tcp)", e.redisSocket)
	check(e.redisType != "SINGLE" && e.redisType != "SENTINEL" && e.redisType != "CLUSTER", "$REDIS_TYPE=%q: use SINGLE, SENTINEL or CLUSTER", e.redisType)
	check(e.grpcTLS && (e.grpcCert == "" || e.grpcKey == ""), "$GRPC_SERVER_USE_TLS=true needs $GRPC_SERVER_TLS_CERT and $GRPC_SERVER_TLS_KEY")
	check(e.xds.useTLS && (e.xds.cert == "") != (e.xds.key == ""), "$CONFIG_GRPC_XDS_CLIENT_TLS_CERT and $CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
	check(e.tracing.protocol != "http" && e.tracing.protocol != "grpc", "$TRACING_EXPORTER_PROTOCOL=%q: use http or grpc", e.tracing.protocol)
	for _, p := range []struct {
		name string
		n    int
	}{{"PORT", e.port}, {"DEBUG_PORT", e.debugPort}, {"GRPC_PORT", e.grpcPort}} {
		check(p.n < 0 || p.n > 65535, "$%s=%d: not a port", p.name, p.n)
	}
	errs = append(errs, e.valueProblems(getenv)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return e, nil
}

// addr joins a host and a port.
func addr(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// runtimeDir is where envoyproxy/ratelimit reads its files:
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (e *Env) runtimeDir() string { return filepath.Join(e.runtimeRoot, e.runtimeSub, e.runtimeApp) }

// redis maps REDIS_TYPE and REDIS_URL to sluice's mode and addresses: a
// comma-separated list, as theirs; for SENTINEL its first element is the
// master's name. "redis://host:port" is read as host:port.
func (e *Env) redis() (mode string, addrs []string, master string, err error) {
	if e.redisURL == "" {
		return "memory", nil, "", nil
	}
	for _, a := range strings.Split(e.redisURL, ",") {
		a = strings.TrimSpace(a)
		for _, p := range []string{"redis://", "rediss://"} {
			a = strings.TrimPrefix(a, p)
		}
		if a != "" {
			addrs = append(addrs, a)
		}
	}
	for i, a := range addrs {
		if e.redisType == "SENTINEL" && i == 0 {
			continue // the master's name
		}
		if p := valuecheck.DialAddr(a, false); p != "" {
			return "", nil, "", fmt.Errorf("$REDIS_URL=%q: %q: %s", e.redisURL, a, p)
		}
	}
	switch e.redisType {
	case "SENTINEL":
		if len(addrs) < 2 {
			return "", nil, "", fmt.Errorf("$REDIS_URL=%q: with REDIS_TYPE=SENTINEL give master-name,sentinel:port[,...]", e.redisURL)
		}
		return "sentinel", addrs[1:], addrs[0], nil
	case "CLUSTER":
		return "cluster", addrs, "", nil
	}
	if len(addrs) != 1 {
		return "", nil, "", fmt.Errorf("$REDIS_URL=%q: REDIS_TYPE=SINGLE takes one host:port", e.redisURL)
	}
	return "standalone", addrs, "", nil
}

// redisUser splits REDIS_AUTH ("user:password" or "password").
func (e *Env) redisUser() (user, password string) {
	if i := strings.IndexByte(e.redisAuth, ':'); i >= 0 {
		return e.redisAuth[:i], e.redisAuth[i+1:]
	}
	return "", e.redisAuth
}

// clientCA returns the CA the decision port checks client certificates
// with: GRPC_CLIENT_TLS_CACERT (envoyproxy/ratelimit's), else
// GRPC_SERVER_TLS_CA_CERT (which Envoy Gateway sets and envoyproxy/ratelimit
// does not read) unless SLUICE_IGNORE_GRPC_SERVER_TLS_CA_CERT=true.
func (e *Env) clientCA() string {
	switch {
	case !e.grpcTLS:
		return ""
	case e.grpcClientCA != "":
		return e.grpcClientCA
	case e.ignoreServerCA:
		return ""
	}
	return e.grpcServerCA
}

// LogLevel and LogFormat are LOG_LEVEL and LOG_FORMAT, lower case.
func (e *Env) LogLevel() string  { return e.logLevel }
func (e *Env) LogFormat() string { return e.logFormat }

// ConfigType is CONFIG_TYPE: FILE or GRPC_XDS_SOTW.
func (e *Env) ConfigType() string { return e.configType }

// XDS reports whether the configuration comes from an xDS server
// (CONFIG_TYPE=GRPC_XDS_SOTW) rather than the runtime directory.
func (e *Env) XDS() bool { return e.configType == configTypeXDS }

// XDSServer is CONFIG_GRPC_XDS_SERVER_URL.
func (e *Env) XDSServer() string { return e.xds.serverURL }

// ForceStart is FORCE_START_WITHOUT_INITIAL_CONFIG: with xDS, serve before
// the first configuration arrives.
func (e *Env) ForceStart() bool { return e.forceStart }

// PolicyFiles are the policy files or directories: the runtime directory
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY), or with xDS
// $SLUICE_POLICY's, for domains beside the xDS-owned ones (none when it is
// unset).
func (e *Env) PolicyFiles() []string {
	if !e.XDS() {
		return []string{e.runtimeDir()}
	}
	var files []string
	for _, p := range strings.Split(e.getenv("SLUICE_POLICY"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			files = append(files, p)
		}
	}
	return files
}

// SeedOnly is $SLUICE_POLICY_SEED_ONLY=true: the policy files seed an empty
// policy store and own no domain. Without it they own their domains, as
// envoyproxy/ratelimit's files are the truth at every start.
func (e *Env) SeedOnly() bool { return e.getenv("SLUICE_POLICY_SEED_ONLY") == "true" }

// RuntimeWatch is RUNTIME_WATCH_ROOT: put the policy files in force when
// they change.
func (e *Env) RuntimeWatch() bool { return e.runtimeWatch }

// Tracing returns the tracer's configuration from TRACING_*, and whether
// TRACING_ENABLED asks for one; TracingEndpoint is
// OTEL_EXPORTER_OTLP_ENDPOINT, which the exporter reads itself.
func (e *Env) Tracing() (tracing.Config, bool) {
	t := e.tracing
	return tracing.Config{Protocol: t.protocol, ServiceName: t.serviceName, ServiceNamespace: t.namespace,
		InstanceID: t.inst, SamplingRate: t.samplingRate}, t.enabled
}

// TracingEndpoint is OTEL_EXPORTER_OTLP_ENDPOINT ("" when unset).
func (e *Env) TracingEndpoint() string { return e.tracing.endpoint }
