package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/degrade"
	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/internal/valuecheck"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// config is what the flags say.
type config struct {
	grpcAddr, httpAddr  string
	grpcServer          string
	grpcCert, grpcKey   string
	grpcCA, grpcSAN     string
	redisMode           string
	redisAddrs          listFlag
	redisMaster         string
	redisDB             int
	redisUser           string
	redisPasswordFile   string
	redisNoFunctions    bool
	redisTLS            bool
	redisTLSFiles       redisstore.TLS
	policies            listFlag
	policySeedOnly      bool
	policyAddr          string
	policyTokenFile     string
	policyCert          string
	policyKey           string
	policyCA            string
	policyFile          string
	deadline, probe     time.Duration
	trip                degrade.Trip
	maxDescriptors      int
	policyWatch         time.Duration
	nearLimitRatio      float64
	ruleValues          int
	settleTTL           time.Duration
	settleMaxTokens     int64
	memEntries          int
	memBytes            int64
	shutdown            time.Duration
	logLevel, logFormat string
	pprof               bool
	chargePastLimit     bool
	quotaMode           bool
	responseMetadata    bool
	gcPercent           int
	gcPercentSet        bool // given by flag or $SLUICE_GC_PERCENT
	rlqsAddr            string
	rlqsTTL             time.Duration
	rlqsMaxBuckets      int
	rlqsMaxBucketBytes  int64
	maxConns            int
	maxStreamsPerConn   int
	maxConnBufferBytes  int64
	maxBufferBytes      int64
	idleTimeout         time.Duration
	firstCallTimeout    time.Duration
	requestBodyTimeout  time.Duration
	maxMsgBytes         int64
	version             bool // -version: print and exit
}

// listFlag is a comma-separated, repeatable flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// parseFlags reads args, then the SLUICE_* environment for flags not given.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs, envOf := newFlagSet(c)
	if err := parseArgs(fs, args, stderr); err != nil {
		return nil, err
	}
	return c.finish(fs, envOf, getenv)
}

// newFlagSet defines every flag on c's fields and returns the flag set
// with each flag's environment variable.
func newFlagSet(c *config) (*flag.FlagSet, map[string]string) {
	fs := flag.NewFlagSet("sluice-controlplane", flag.ContinueOnError)
	envOf := map[string]string{}
	str := func(p *string, name, env, def, usage string) {
		fs.StringVar(p, name, def, usage+" ($"+env+")")
		envOf[name] = env
	}
	dur := func(p *time.Duration, name, env string, def time.Duration, usage string) {
		fs.DurationVar(p, name, def, usage+" ($"+env+")")
		envOf[name] = env
	}
	num := func(p *int, name, env string, def int, usage string) {
		fs.IntVar(p, name, def, usage+" ($"+env+")")
		envOf[name] = env
	}
	i64 := func(p *int64, name, env string, def int64, usage string) {
		fs.Int64Var(p, name, def, usage+" ($"+env+")")
		envOf[name] = env
	}
	str(&c.grpcAddr, "grpc-addr", "SLUICE_GRPC_ADDR", server.DefaultGRPCAddr, "gRPC listen address (ShouldRateLimit)")
	str(&c.grpcServer, "grpc-server", "SLUICE_GRPC_SERVER", server.GRPCServerUnary, "decision port server: unary (lean HTTP/2: ShouldRateLimit and Health/Check) or grpc-go")
	str(&c.grpcCert, "grpc-tls-cert", "SLUICE_GRPC_TLS_CERT", "", "TLS certificate of the decision port (default: plaintext)")
	str(&c.grpcKey, "grpc-tls-key", "SLUICE_GRPC_TLS_KEY", "", "TLS key of the decision port")
	str(&c.grpcCA, "grpc-client-ca", "SLUICE_GRPC_CLIENT_CA", "", "CA whose client certificates the decision port requires (mTLS)")
	str(&c.grpcSAN, "grpc-client-san", "SLUICE_GRPC_CLIENT_SAN", "", "with -grpc-client-ca: accept only client certificates holding this DNS or URI SAN")
	str(&c.httpAddr, "http-addr", "SLUICE_HTTP_ADDR", server.DefaultHTTPAddr, "HTTP listen address (/metrics, /healthz, /readyz)")
	str(&c.redisMode, "redis-mode", "SLUICE_REDIS_MODE", "", "memory, standalone, sentinel or cluster (default: standalone with -redis-addrs, else memory)")
	fs.Var(&c.redisAddrs, "redis-addrs", "comma-separated Redis host:port: the server, the sentinels or cluster seed nodes ($SLUICE_REDIS_ADDRS)")
	envOf["redis-addrs"] = "SLUICE_REDIS_ADDRS"
	str(&c.redisMaster, "redis-master", "SLUICE_REDIS_MASTER", "", "Sentinel master name")
	num(&c.redisDB, "redis-db", "SLUICE_REDIS_DB", 0, "Redis database (standalone, sentinel)")
	str(&c.redisUser, "redis-username", "SLUICE_REDIS_USERNAME", "", "Redis ACL user name")
	str(&c.redisPasswordFile, "redis-password-file", "SLUICE_REDIS_PASSWORD_FILE", "", "file holding the Redis password (or set $SLUICE_REDIS_PASSWORD)")
	fs.BoolVar(&c.redisTLS, "redis-tls", false, "reach Redis over TLS; implied by the other -redis-tls-* flags ($SLUICE_REDIS_TLS)")
	envOf["redis-tls"] = "SLUICE_REDIS_TLS"
	str(&c.redisTLSFiles.CAFile, "redis-tls-ca", "SLUICE_REDIS_TLS_CA", "", "CA bundle that signs the Redis servers' certificates (default: the system's roots)")
	str(&c.redisTLSFiles.CertFile, "redis-tls-cert", "SLUICE_REDIS_TLS_CERT", "", "client certificate for Redis")
	str(&c.redisTLSFiles.KeyFile, "redis-tls-key", "SLUICE_REDIS_TLS_KEY", "", "client key for Redis")
	str(&c.redisTLSFiles.ServerName, "redis-tls-server-name", "SLUICE_REDIS_TLS_SERVER_NAME", "", "name the Redis servers' certificates must hold (default: the host of each address)")
	fs.Var(&c.policies, "policy", "policy file or directory, comma-separated or repeated: the files own their domains, put in force at start, on SIGHUP and when they change (the newest files win) ($SLUICE_POLICY)")
	envOf["policy"] = "SLUICE_POLICY"
	fs.BoolVar(&c.policySeedOnly, "policy-seed-only", false, "the -policy files only seed an empty policy store and own no domain: after that ratectl changes them, and a changed file is applied on SIGHUP only (the behaviour before files owned their domains) ($SLUICE_POLICY_SEED_ONLY)")
	envOf["policy-seed-only"] = "SLUICE_POLICY_SEED_ONLY"
	dur(&c.policyWatch, "policy-watch", "SLUICE_POLICY_WATCH", 0, "put the -policy files in force, as SIGHUP does, when their contents change, checking this often (0: off; e.g. 10s for a Kubernetes ConfigMap)")
	str(&c.policyAddr, "policy-addr", "SLUICE_POLICY_ADDR", server.DefaultPolicyAddr, "policy service listen address (authenticated)")
	str(&c.policyTokenFile, "policy-token-file", "SLUICE_POLICY_TOKEN_FILE", "", "file of bearer tokens the policy service accepts, one a line (or set $SLUICE_TOKEN)")
	str(&c.policyCert, "policy-tls-cert", "SLUICE_POLICY_TLS_CERT", "", "TLS certificate of the policy listener")
	str(&c.policyKey, "policy-tls-key", "SLUICE_POLICY_TLS_KEY", "", "TLS key of the policy listener")
	str(&c.policyCA, "policy-client-ca", "SLUICE_POLICY_CLIENT_CA", "", "CA whose client certificates the policy service accepts (mTLS)")
	str(&c.policyFile, "policy-file", "SLUICE_POLICY_FILE", "", "without Redis: file keeping the policies applied at run time")
	dur(&c.deadline, "deadline", "SLUICE_DEADLINE", degrade.DefaultDeadline, "Redis decision deadline; past it the memory store answers")
	dur(&c.probe, "probe-interval", "SLUICE_PROBE_INTERVAL", degrade.DefaultProbeInterval, "Redis health probe interval while degraded")
	num(&c.trip.Failures, "degrade-after-failures", "SLUICE_DEGRADE_AFTER_FAILURES", degrade.DefaultTripFailures, "Redis failures in a row (calls that overlap count once) that switch to the memory store; a single one is answered locally")
	fs.Float64Var(&c.trip.Ratio, "degrade-failure-ratio", degrade.DefaultTripRatio, "share of failed Redis calls over -degrade-failure-window that switches to the memory store; above 1 turns it off ($SLUICE_DEGRADE_FAILURE_RATIO)")
	envOf["degrade-failure-ratio"] = "SLUICE_DEGRADE_FAILURE_RATIO"
	dur(&c.trip.Window, "degrade-failure-window", "SLUICE_DEGRADE_FAILURE_WINDOW", degrade.DefaultTripWindow, "span -degrade-failure-ratio is measured over")
	num(&c.maxDescriptors, "max-descriptors", "SLUICE_MAX_DESCRIPTORS", rls.DefaultMaxDescriptors, "descriptors allowed in one request")
	fs.Float64Var(&c.nearLimitRatio, "near-limit-ratio", rls.DefaultNearLimitRatio, "share of a limit past which admitted hits count as near the limit (sluice_rule_near_limit_total) ($SLUICE_NEAR_LIMIT_RATIO)")
	envOf["near-limit-ratio"] = "SLUICE_NEAR_LIMIT_RATIO"
	num(&c.ruleValues, "rule-metric-values", "SLUICE_RULE_METRIC_VALUES", rls.DefaultMaxRuleValues, "request values a detailed_metric or value_to_metric rule labels in its statistics; the rest share <rule>@_other")
	dur(&c.settleTTL, "settle-dedupe-ttl", "SLUICE_SETTLE_DEDUPE_TTL", memory.DefaultOnceTTL, "how long a settlement's token (x-sluice-settle, from sluice's filter) is remembered: a retry within it charges nothing (at least 1ms)")
	i64(&c.settleMaxTokens, "settle-max-tokens", "SLUICE_SETTLE_MAX_TOKENS", rls.DefaultSettleTokens, "settlement tokens this replica may have the store remember within -settle-dedupe-ttl (Redis: 133 bytes each), shared fairly among clients; more are refused with RESOURCE_EXHAUSTED and sent again by the filter (without Redis: at most the memory store's 100000)")
	num(&c.memEntries, "memory-max-entries", "SLUICE_MEMORY_MAX_ENTRIES", memory.DefaultMaxEntries, "memory store bound on keys")
	fs.Int64Var(&c.memBytes, "memory-max-bytes", memory.DefaultMaxBytes, "memory store bound on approximate bytes ($SLUICE_MEMORY_MAX_BYTES)")
	envOf["memory-max-bytes"] = "SLUICE_MEMORY_MAX_BYTES"
	dur(&c.shutdown, "shutdown-timeout", "SLUICE_SHUTDOWN_TIMEOUT", server.DefaultShutdownTimeout, "graceful drain limit on SIGTERM/SIGINT")
	str(&c.logLevel, "log-level", "SLUICE_LOG_LEVEL", "info", "debug, info, warn or error")
	str(&c.logFormat, "log-format", "SLUICE_LOG_FORMAT", "auto", "auto (text on a terminal, else json), json or text")
	fs.BoolVar(&c.redisNoFunctions, "redis-no-functions", false, "run the Redis scripts by EVALSHA, never as a function library (FUNCTION LOAD, FCALL) ($SLUICE_REDIS_NO_FUNCTIONS)")
	envOf["redis-no-functions"] = "SLUICE_REDIS_NO_FUNCTIONS"
	fs.BoolVar(&c.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the HTTP address ($SLUICE_PPROF)")
	envOf["pprof"] = "SLUICE_PPROF"
	fs.BoolVar(&c.chargePastLimit, "charge-past-limit", false, "every limit charges a request's cost even past the limit (usage that already happened), as a descriptor's charge_past_limit; refused requests then count, as in envoyproxy/ratelimit ($SLUICE_CHARGE_PAST_LIMIT)")
	envOf["charge-past-limit"] = "SLUICE_CHARGE_PAST_LIMIT"
	fs.BoolVar(&c.quotaMode, "quota-mode", false, "every descriptor in quota_mode: a request is over limit only when all its quota descriptors are (envoyproxy/ratelimit's QUOTA_MODE) ($SLUICE_QUOTA_MODE)")
	envOf["quota-mode"] = "SLUICE_QUOTA_MODE"
	fs.BoolVar(&c.responseMetadata, "response-dynamic-metadata", false, "add envoyproxy/ratelimit's dynamic metadata to every answer: domain, descriptors, hitsAddend and the passed descriptors' metadata (its RESPONSE_DYNAMIC_METADATA) ($SLUICE_RESPONSE_DYNAMIC_METADATA)")
	envOf["response-dynamic-metadata"] = "SLUICE_RESPONSE_DYNAMIC_METADATA"
	str(&c.rlqsAddr, "rlqs-addr", "SLUICE_RLQS_ADDR", "", "Envoy's Rate Limit Quota Service (RLQS) listen address (default: off)")
	dur(&c.rlqsTTL, "rlqs-ttl", "SLUICE_RLQS_TTL", rlqs.DefaultTTL, "RLQS assignment time to live, whole seconds (3 of Envoy's 5 s reports)")
	num(&c.rlqsMaxBuckets, "rlqs-max-buckets", "SLUICE_RLQS_MAX_BUCKETS", rlqs.DefaultMaxBuckets, "RLQS buckets one Envoy stream may have")
	i64(&c.rlqsMaxBucketBytes, "rlqs-max-bucket-bytes", "SLUICE_RLQS_MAX_BUCKET_BYTES", rlqs.DefaultMaxBucketBytes, "RLQS: bytes the buckets of all streams may hold (about 1.6 KiB per bucket of a short id), shared fairly among connections")
	num(&c.maxConns, "max-conns", "SLUICE_MAX_CONNS", connbounds.Default.MaxConns, "decision port: connections open at once; more are closed at once (grpc-go mode: the one idle longest is closed to make room)")
	num(&c.maxStreamsPerConn, "max-streams-per-conn", "SLUICE_MAX_STREAMS_PER_CONN", int(connbounds.Default.MaxStreamsPerConn), "decision port: concurrent calls on one connection (HTTP/2 MAX_CONCURRENT_STREAMS)")
	i64(&c.maxConnBufferBytes, "max-conn-buffer-bytes", "SLUICE_MAX_CONN_BUFFER_BYTES", connbounds.Default.MaxConnBufferBytes, "decision port: request bytes one connection may have buffered")
	i64(&c.maxBufferBytes, "max-buffer-bytes", "SLUICE_MAX_BUFFER_BYTES", connbounds.Default.MaxBufferBytes, "decision port: request bytes all connections together may have buffered")
	dur(&c.idleTimeout, "idle-timeout", "SLUICE_IDLE_TIMEOUT", connbounds.Default.IdleTimeout, "close connections (every listener) without calls after this long")
	dur(&c.firstCallTimeout, "first-call-timeout", "SLUICE_FIRST_CALL_TIMEOUT", connbounds.Default.FirstCallTimeout, "close a connection that completed no call this long after it opened (every listener); at their caps the listeners evict the connection idle longest, not the new one")
	dur(&c.requestBodyTimeout, "request-body-timeout", "SLUICE_REQUEST_BODY_TIMEOUT", connbounds.Default.BodyTimeout, "reset a decision call whose request body is not complete this long after its headers, and free its buffer (both server modes)")
	i64(&c.maxMsgBytes, "max-msg-bytes", "SLUICE_MAX_MSG_BYTES", int64(connbounds.Default.MaxMsgBytes), "decision port: largest request message; a larger one is answered RESOURCE_EXHAUSTED")
	num(&c.gcPercent, "gc-percent", "SLUICE_GC_PERCENT", DefaultGCPercent, "Go GC target percentage, as GOGC (default 400, or $GOGC when set)")
	fs.BoolVar(&c.version, "version", false, "print the version, commit and Go version, and exit")
	return fs, envOf
}

// finish reads the SLUICE_* environment for the flags fs was not given and
// checks the whole configuration.
func (c *config) finish(fs *flag.FlagSet, envOf map[string]string, getenv func(string) string) (*config, error) {
	if c.version {
		return c, nil
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q (every setting is a flag)", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := envOf[f.Name]
		if set[f.Name] || env == "" {
			return
		}
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("$%s=%q: invalid value for -%s: %v", env, v, f.Name, err))
			}
		}
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.gcPercentSet = set["gc-percent"] || getenv("SLUICE_GC_PERCENT") != ""
	switch {
	case c.gcPercent <= 0:
		errs = append(errs, fmt.Errorf("-gc-percent must be positive (got %d)", c.gcPercent))
	case c.deadline <= 0:
		errs = append(errs, fmt.Errorf("-deadline must be positive (got %v)", c.deadline))
	case c.probe <= 0:
		errs = append(errs, fmt.Errorf("-probe-interval must be positive (got %v)", c.probe))
	case c.trip.Failures <= 0 || !(c.trip.Ratio > 0) || c.trip.Window <= 0:
		errs = append(errs, fmt.Errorf("-degrade-after-failures, -degrade-failure-ratio and -degrade-failure-window must be positive (got %d, %v, %v)", c.trip.Failures, c.trip.Ratio, c.trip.Window))
	case c.shutdown <= 0:
		errs = append(errs, fmt.Errorf("-shutdown-timeout must be positive (got %v)", c.shutdown))
	case c.settleTTL < time.Millisecond:
		errs = append(errs, fmt.Errorf("-settle-dedupe-ttl must be at least 1ms (got %v)", c.settleTTL))
	case c.maxDescriptors <= 0:
		errs = append(errs, fmt.Errorf("-max-descriptors must be positive (got %d)", c.maxDescriptors))
	case c.maxConns <= 0 || c.maxStreamsPerConn <= 0 || c.maxConnBufferBytes <= 0 || c.maxBufferBytes <= 0 || c.idleTimeout <= 0 || c.maxMsgBytes <= 0:
		errs = append(errs, errors.New("-max-conns, -max-streams-per-conn, -max-msg-bytes, -max-conn-buffer-bytes, -max-buffer-bytes and -idle-timeout must be positive"))
	case c.firstCallTimeout <= 0 || c.requestBodyTimeout <= 0:
		errs = append(errs, fmt.Errorf("-first-call-timeout and -request-body-timeout must be positive (got %v, %v)", c.firstCallTimeout, c.requestBodyTimeout))
	case c.maxStreamsPerConn > math.MaxInt32:
		errs = append(errs, fmt.Errorf("-max-streams-per-conn must be at most %d (HTTP/2 stream ids)", math.MaxInt32))
	case c.maxMsgBytes > math.MaxInt32:
		errs = append(errs, fmt.Errorf("-max-msg-bytes must be at most %d", math.MaxInt32))
	case c.memEntries <= 0 || c.memBytes <= 0:
		errs = append(errs, errors.New("-memory-max-entries and -memory-max-bytes must be positive"))
	case c.rlqsTTL < 2*time.Second || c.rlqsTTL%time.Second != 0 || c.rlqsMaxBuckets <= 0:
		errs = append(errs, fmt.Errorf("-rlqs-ttl must be whole seconds, at least 2s, and -rlqs-max-buckets positive (got %v, %d)", c.rlqsTTL, c.rlqsMaxBuckets))
	case c.rlqsMaxBucketBytes <= 0:
		errs = append(errs, fmt.Errorf("-rlqs-max-bucket-bytes must be positive (got %d)", c.rlqsMaxBucketBytes))
	case (c.policyCert == "") != (c.policyKey == ""):
		errs = append(errs, errors.New("-policy-tls-cert and -policy-tls-key go together"))
	case c.policyCA != "" && c.policyCert == "":
		errs = append(errs, errors.New("-policy-client-ca needs TLS: give -policy-tls-cert and -policy-tls-key"))
	case (c.grpcCert == "") != (c.grpcKey == ""):
		errs = append(errs, errors.New("-grpc-tls-cert and -grpc-tls-key go together"))
	case c.grpcCA != "" && c.grpcCert == "":
		errs = append(errs, errors.New("-grpc-client-ca needs TLS: give -grpc-tls-cert and -grpc-tls-key"))
	case c.grpcSAN != "" && c.grpcCA == "":
		errs = append(errs, errors.New("-grpc-client-san needs mTLS: give -grpc-client-ca"))
	case (c.redisTLSFiles.CertFile == "") != (c.redisTLSFiles.KeyFile == ""):
		errs = append(errs, errors.New("-redis-tls-cert and -redis-tls-key go together"))
	}
	if c.redisTLSFiles != (redisstore.TLS{}) {
		c.redisTLS = true
	}
	errs = append(errs, c.valueProblems(envOf)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
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
	bad("near-limit-ratio", c.nearLimitRatio, valuecheck.Ratio(c.nearLimitRatio, 0, 1, true))
	if math.IsNaN(c.trip.Ratio) {
		bad("degrade-failure-ratio", c.trip.Ratio, "not a number (above 1 turns the ratio off)")
	}
	for _, l := range []struct{ flag, addr string }{
		{"grpc-addr", c.grpcAddr}, {"http-addr", c.httpAddr}, {"policy-addr", c.policyAddr}, {"rlqs-addr", c.rlqsAddr},
	} {
		if l.addr != "" || l.flag == "grpc-addr" || l.flag == "http-addr" {
			bad(l.flag, strconv.Quote(l.addr), valuecheck.ListenAddr(l.addr))
		}
	}
	for _, a := range c.redisAddrs {
		bad("redis-addrs", strconv.Quote(a), valuecheck.DialAddr(a, false))
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
