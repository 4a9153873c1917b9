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
