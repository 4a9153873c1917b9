// Command sluice-controlplane serves sluice's rate-limit decisions:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, and
// /metrics, /healthz and /readyz over HTTP.
//
// Every flag can also be set by an environment variable (flags win):
//
//	-grpc-addr           SLUICE_GRPC_ADDR           gRPC listen address (127.0.0.1:8081)
//	-grpc-tls-cert       SLUICE_GRPC_TLS_CERT       serve the decision port over TLS with this certificate (PEM;
//	                                                re-read when the file changes; default: plaintext h2c)
//	-grpc-tls-key        SLUICE_GRPC_TLS_KEY        ... and this key
//	-grpc-client-ca      SLUICE_GRPC_CLIENT_CA      require client certificates signed by this CA (mTLS)
//	-grpc-client-san     SLUICE_GRPC_CLIENT_SAN     ... that also hold this DNS or URI subject alternative name
//	-http-addr           SLUICE_HTTP_ADDR           HTTP listen address for metrics and health (127.0.0.1:9090)
//	-redis-mode          SLUICE_REDIS_MODE          memory | standalone | sentinel | cluster
//	                                                (default: standalone with -redis-addrs, else memory)
//	-redis-addrs         SLUICE_REDIS_ADDRS         comma-separated host:port: the server, the sentinels or cluster seeds
//	-redis-master        SLUICE_REDIS_MASTER        Sentinel master name
//	-redis-db            SLUICE_REDIS_DB            database number (standalone, sentinel)
//	-redis-username      SLUICE_REDIS_USERNAME      ACL user name
//	-redis-password-file SLUICE_REDIS_PASSWORD_FILE file holding the password
//	                     SLUICE_REDIS_PASSWORD      the password itself (environment only, never a flag)
//	-redis-tls           SLUICE_REDIS_TLS           reach Redis over TLS (false; implied by the flags below)
//	-redis-tls-ca        SLUICE_REDIS_TLS_CA        CA bundle (PEM) that signs the Redis servers' certificates
//	                                                (default: the system's roots)
//	-redis-tls-cert      SLUICE_REDIS_TLS_CERT      client certificate for Redis (tls-auth-clients; re-read when
//	                                                the file changes)
//	-redis-tls-key       SLUICE_REDIS_TLS_KEY       ... and its key
//	-redis-tls-server-name SLUICE_REDIS_TLS_SERVER_NAME  name the servers' certificates must hold
//	                                                (default: the host of each address)
//	-redis-no-functions  SLUICE_REDIS_NO_FUNCTIONS  run the scripts by EVALSHA, never as a Redis 7 function
//	                                                library (FUNCTION LOAD, FCALL) (false)
//	-policy              SLUICE_POLICY              comma-separated policy files or directories (repeatable):
//	                                                the files own their domains (ratectl cannot change
//	                                                them) and are put in force at start, on SIGHUP and
//	                                                when they change; the newest files win (default: the
//	                                                embedded example policies, domain sluice-demo, which
//	                                                seed an empty store only)
//	-policy-seed-only    SLUICE_POLICY_SEED_ONLY    the -policy files only seed an empty store and own no
//	                                                domain (SIGHUP applies them as ratectl would) (false)
//	-policy-watch        SLUICE_POLICY_WATCH        check the -policy files this often and put them in force,
//	                                                as SIGHUP does, when their contents change (0: off)
//	-policy-addr         SLUICE_POLICY_ADDR         policy service listen address (127.0.0.1:8082)
//	-policy-token-file   SLUICE_POLICY_TOKEN_FILE   bearer tokens the policy service accepts, one a line
//	                     SLUICE_TOKEN               one accepted token (environment only, never a flag)
//	-policy-tls-cert     SLUICE_POLICY_TLS_CERT     serve the policy service over TLS with this certificate
//	-policy-tls-key      SLUICE_POLICY_TLS_KEY      ... and this key
//	-policy-client-ca    SLUICE_POLICY_CLIENT_CA    accept client certificates from this CA (mTLS)
//	-policy-file         SLUICE_POLICY_FILE         without Redis: the file that keeps applied policies
//	                                                (default: none, they last as long as the process)
//	-deadline            SLUICE_DEADLINE            Redis decision deadline before the memory store answers (20ms)
//	-probe-interval      SLUICE_PROBE_INTERVAL      Redis health probe interval while degraded (200ms)
//	-degrade-after-failures SLUICE_DEGRADE_AFTER_FAILURES  Redis failures in a row that switch to the memory store (5)
//	-degrade-failure-ratio  SLUICE_DEGRADE_FAILURE_RATIO   share of failed Redis calls that switches (0.5; above 1: off)
//	-degrade-failure-window SLUICE_DEGRADE_FAILURE_WINDOW  span that ratio is measured over (1s)
//	-max-descriptors     SLUICE_MAX_DESCRIPTORS     descriptors allowed in one request (256)
//	-near-limit-ratio    SLUICE_NEAR_LIMIT_RATIO    share of a limit past which admitted hits count as near
//	                                                the limit, as envoyproxy/ratelimit's NEAR_LIMIT_RATIO (0.8)
//	-rule-metric-values  SLUICE_RULE_METRIC_VALUES  request values one detailed_metric or value_to_metric
//	                                                rule labels in the per-rule statistics (100)
//	-settle-dedupe-ttl   SLUICE_SETTLE_DEDUPE_TTL   how long a settlement's token (x-sluice-settle) is
//	                                                remembered: a retry within it charges nothing (15m)
//	-memory-max-entries  SLUICE_MEMORY_MAX_ENTRIES  memory store bound on keys (1048576)
//	-memory-max-bytes    SLUICE_MEMORY_MAX_BYTES    memory store bound on bytes (268435456)
//	-shutdown-timeout    SLUICE_SHUTDOWN_TIMEOUT    graceful drain limit on SIGTERM/SIGINT (10s)
//	-max-conns           SLUICE_MAX_CONNS           decision port: connections open at once (1024)
//	-max-streams-per-conn SLUICE_MAX_STREAMS_PER_CONN decision port: concurrent calls on one connection (100)
//	-max-conn-buffer-bytes SLUICE_MAX_CONN_BUFFER_BYTES decision port: buffered request bytes of one
//	                                                connection (4194304)
//	-max-buffer-bytes    SLUICE_MAX_BUFFER_BYTES    decision port: buffered request bytes in all (67108864)
//	-idle-timeout        SLUICE_IDLE_TIMEOUT        close connections without calls after this long (5m)
//	-first-call-timeout  SLUICE_FIRST_CALL_TIMEOUT  close a connection that completed no call this long after
//	                                                it opened (10s; every listener); at their caps the
//	                                                listeners evict the connection idle longest (one with
//	                                                no call yet first), not the new one
//	-request-body-timeout SLUICE_REQUEST_BODY_TIMEOUT reset a decision call whose request body is not complete
//	                                                this long after its headers, and free its buffer (2s)
//	-max-msg-bytes       SLUICE_MAX_MSG_BYTES       decision port: largest request message (65536)
//	                     The -max-* flags bound the decision port in both server modes; the
//	                     timeouts bound every listener (docs/controlplane.md, "Bounds").
//	-charge-past-limit   SLUICE_CHARGE_PAST_LIMIT   every limit charges a request's cost even past the
//	                                                limit, as charge_past_limit does (false; see
//	                                                docs/usage-based.md)
//	-quota-mode          SLUICE_QUOTA_MODE          every descriptor in quota_mode, as envoyproxy/
//	                                                ratelimit's QUOTA_MODE (false)
//	-response-dynamic-metadata SLUICE_RESPONSE_DYNAMIC_METADATA  add envoyproxy/ratelimit's
//	                                                dynamic metadata (RESPONSE_DYNAMIC_METADATA) (false)
//	-log-level           SLUICE_LOG_LEVEL           debug | info | warn | error (info)
//	-log-format          SLUICE_LOG_FORMAT          auto | json | text (auto: text on a terminal, else json)
//	-pprof               SLUICE_PPROF               serve net/http/pprof under /debug/pprof/ on the HTTP
//	                                                address (false; for profiling, never on a shared port)
//	-rlqs-addr           SLUICE_RLQS_ADDR           Envoy's Rate Limit Quota Service listen address (off)
//	-rlqs-ttl            SLUICE_RLQS_TTL            RLQS assignment time to live, whole seconds (15s)
//	-rlqs-max-buckets    SLUICE_RLQS_MAX_BUCKETS    RLQS buckets one Envoy stream may have (1024)
//	-rlqs-max-bucket-bytes SLUICE_RLQS_MAX_BUCKET_BYTES RLQS bytes the buckets of all streams may hold (128 MiB)
//	-version                                        print the version, commit and Go version, and exit
//	-gc-percent          SLUICE_GC_PERCENT          the Go garbage collector's target, as GOGC (400, or
//	                                                $GOGC when that is set and this is not): the live
//	                                                heap is small, and collecting it less often leaves
//	                                                CPU to decisions; the heap may grow to 5x the live set,
//	                                                within the Go memory limit: unless $GOMEMLIMIT is set,
//	                                                1.5 x -memory-max-bytes + 24 MiB, which keeps RSS
//	                                                within 1.5 x -memory-max-bytes + 64 MiB
//
// With Redis, policies live in Redis and every replica converges on them.
// Without a token or client CA the policy service is off (logged).
// Exit status: 0 after a clean shutdown, 1 when serving fails, 2 for bad
// flags or configuration.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/logthrottle"
	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/policy"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/tlsfiles"
	"github.com/sluicehq/sluice/internal/version"
)

func main() {
	if filepath.Base(os.Args[0]) == RatelimitName {
		os.Exit(runRatelimit(os.Getenv, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// stdout receives -version's line.
var stdout io.Writer = os.Stdout

// DefaultGCPercent is -gc-percent's default: the control plane's live heap
// is small (policies; the memory store only while degraded), and at the
// allocation rate of tens of thousands of gRPC calls a second the default
// GOGC of 100 spends a large share of the CPU collecting it.
const DefaultGCPercent = 400

// RSSOverhead is the fixed part of the bound on the process's RSS: under
// any load on the memory store, RSS stays within 1.5 x -memory-max-bytes +
// RSSOverhead (TestBinaryMemoryBound). It covers the binary's own pages
// (about 15 MiB), the runtime, stacks, policies, metrics and the decision
// port's working memory at ordinary load.
const RSSOverhead = 64 << 20

// memoryLimit returns the Go memory limit (GOMEMLIMIT) derived from the
// memory store's bound: the store's bytes, half as much again for the
// garbage collector to work in, and 24 MiB for the rest of the heap; RSS
// adds the binary's pages and what the collector returns late. Under the
// limit the collector runs as often as it must, whatever -gc-percent says;
// with a small live heap (Redis answering, the store nearly empty)
// -gc-percent alone paces it, as before. A full store churned by new keys
// costs more collector CPU (2M keys through a 256 MiB store: +34% server
// CPU); a limit closer to the bound would cost more. An explicit
// $GOMEMLIMIT wins.
func memoryLimit(storeBytes int64) int64 {
	const maxLimit = math.MaxInt64 / 2
	if storeBytes > maxLimit/2 {
		return maxLimit
	}
	return storeBytes + storeBytes/2 + 24<<20
}

// newLogger returns the slog logger the flags ask for. Repeated lines are
// throttled (logthrottle: the first 10 alike per 10 s, then one summary), so
// that no client can flood the log with refused calls or failed decisions.
func newLogger(c *config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level %q: use debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	format := c.logFormat
	if format == "auto" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	switch format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("-log-format %q: use auto, json or text", c.logFormat)
	}
	return slog.New(logthrottle.New(h, logthrottle.Options{})), nil
}

// isTerminal reports whether w is a character device (a terminal), where
// people read the log, rather than a file or pipe a collector reads.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// run is main with its inputs injected; it returns the exit status.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	c, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-controlplane:", err)
		return 2
	}
	if c.version {
		fmt.Fprintln(stdout, "sluice-controlplane", version.Get())
		return 0
	}
	log, err := newLogger(c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sluice-controlplane:", err)
		return 2
	}
	if h, ok := log.Handler().(*logthrottle.Handler); ok {
		defer h.Close() // report the lines still held back
	}
	server.SetRedisLogger(log)
	hup := make(chan os.Signal, 1) // before the policies are read: SIGHUP must never end the process
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if c.gcPercentSet || getenv("GOGC") == "" {
		debug.SetGCPercent(c.gcPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		// The live heap that grows with load: the memory store and the
		// RLQS buckets. (RLQS reports in flight, up to
		// rlqs.ServerConfig.MaxBytes under attack, are left out: the
		// collector then works harder, within the runtime's CPU cap.)
		bounded := c.memBytes
		if c.rlqsAddr != "" {
			bounded += c.rlqsMaxBucketBytes
		}
		limit := memoryLimit(bounded)
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit set from the bounds", "gomemlimit_bytes", limit, "memory_max_bytes", c.memBytes, "rlqs_max_bucket_bytes", c.rlqsMaxBucketBytes)
	}

	policies := policy.Example()
	var files []policystore.Source
	if len(c.policies) > 0 {
		if policies, files, err = readPolicies(c.policies, c.policySeedOnly); err != nil {
			log.Error("invalid policy: fix the files named below", "error", err.Error())
			return 2
		}
	} else {
		log.Info("no -policy given: the start-up policies are the embedded example (domain sluice-demo); they seed the policy store only if it is empty")
	}
	auth, tlsConfig, err := policyAuth(c, getenv)
	if err != nil {
		log.Error("policy service credentials", "error", err.Error())
		return 2
	}
	password := getenv("SLUICE_REDIS_PASSWORD")
	if c.redisPasswordFile != "" {
		b, err := os.ReadFile(c.redisPasswordFile)
		if err != nil {
			log.Error("cannot read the Redis password file", "error", err.Error())
			return 2
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	var redisTLS *redisstore.TLS
	if c.redisTLS {
		redisTLS = &c.redisTLSFiles
	}
	var grpcTLS *tls.Config
	if c.grpcCert != "" {
		if grpcTLS, err = server.DecisionTLSConfig(c.grpcCert, c.grpcKey, c.grpcCA); err != nil {
			log.Error("decision port TLS", "error", err.Error())
			return 2
		}
		if c.grpcSAN != "" {
			server.RequireClientSAN(grpcTLS, c.grpcSAN)
		}
	}
	srv, err := server.New(server.Config{
		GRPCAddr:   c.grpcAddr,
		GRPCServer: c.grpcServer,
		GRPCTLS:    grpcTLS,
		HTTPAddr:   c.httpAddr,
		Redis: server.RedisConfig{
			Mode: c.redisMode, Addrs: c.redisAddrs, MasterName: c.redisMaster,
			Username: c.redisUser, Password: password, DB: c.redisDB,
			NoFunctions: c.redisNoFunctions, TLS: redisTLS,
		},
		Policies:         policies,
		PolicyFiles:      files,
		PolicyAddr:       c.policyAddr,
		PolicyAuth:       auth,
		PolicyTLS:        tlsConfig,
		PolicyFile:       c.policyFile,
		Deadline:         c.deadline,
		ProbeInterval:    c.probe,
		Trip:             c.trip,
		MaxDescriptors:   c.maxDescriptors,
		NearLimitRatio:   c.nearLimitRatio,
		MaxRuleValues:    c.ruleValues,
		SettleDedupeTTL:  c.settleTTL,
		SettleMaxTokens:  c.settleMaxTokens,
		ChargePastLimit:  c.chargePastLimit,
		QuotaMode:        c.quotaMode,
		ResponseMetadata: c.responseMetadata,
		MemoryMaxEntries: c.memEntries,
		MemoryMaxBytes:   c.memBytes,
		ShutdownTimeout:  c.shutdown,
		Pprof:            c.pprof,
		Logger:           log,
		RLQSAddr:         c.rlqsAddr,
		RLQS:             rlqs.Options{TTL: c.rlqsTTL, MaxBuckets: c.rlqsMaxBuckets, MaxBucketBytes: c.rlqsMaxBucketBytes},

		Bounds: connbounds.Bounds{
			MaxConns:           c.maxConns,
			MaxStreamsPerConn:  uint32(c.maxStreamsPerConn),
			MaxConnBufferBytes: c.maxConnBufferBytes,
			MaxBufferBytes:     c.maxBufferBytes,
			IdleTimeout:        c.idleTimeout,
			MaxMsgBytes:        int(c.maxMsgBytes),
			FirstCallTimeout:   c.firstCallTimeout,
			BodyTimeout:        c.requestBodyTimeout,
		},
	})
	if err != nil {
		log.Error("cannot start", "error", err.Error())
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	changed := make(chan struct{}, 1)
	if c.policyWatch > 0 && len(c.policies) > 0 {
		t := time.NewTicker(c.policyWatch)
		defer t.Stop()
		go watchPolicies(ctx, t.C, c.policies, changed)
	}
	go reloadOnHangup(ctx, hup, changed, log, policyFiles{c.policies, c.policySeedOnly}, srv.Policies())
	if err := srv.Run(ctx); err != nil {
		log.Error("serving failed", "error", err.Error())
		return 1
	}
	return 0
}

// policyAuth reads the policy service's credentials: bearer tokens from
// -policy-token-file or $SLUICE_TOKEN, and the TLS and client-CA files.
func policyAuth(c *config, getenv func(string) string) (policyservice.AuthConfig, *tls.Config, error) {
	var a policyservice.AuthConfig
	if c.policyTokenFile != "" || getenv(policyservice.DefaultTokenEnv) != "" {
		toks, err := policyservice.LoadTokens(c.policyTokenFile, policyservice.DefaultTokenEnv)
		if err != nil {
			return a, nil, err
		}
		a.Tokens = toks
	}
	if c.policyCert == "" {
		return a, nil, nil
	}
	tc, err := policyservice.ServerTLSConfig(c.policyCert, c.policyKey, c.policyCA != "")
	if err != nil {
		return a, nil, err
	}
	if c.policyCA != "" {
		if a.ClientCAs, err = tlsfiles.CertPool(c.policyCA); err != nil {
			return a, nil, err
		}
	}
	return a, tc, nil
}
