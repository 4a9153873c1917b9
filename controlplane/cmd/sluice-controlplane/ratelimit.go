package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/logthrottle"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/ratelimitenv"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/internal/tracing"
	"github.com/sluicehq/sluice/controlplane/internal/xdsconfig"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store/memory"
)

// RatelimitName is the name under which the binary reads envoyproxy/ratelimit's
// environment instead of sluice's flags: Envoy Gateway's ratelimit
// Deployment runs /bin/ratelimit.
const RatelimitName = "ratelimit"

// runtimeWatchInterval is how often the runtime directory is checked when
// RUNTIME_WATCH_ROOT is true.
const runtimeWatchInterval = time.Second

// runRatelimit is run for the binary named ratelimit: envoyproxy/ratelimit's
// environment (package ratelimitenv) instead of sluice's flags (see
// docs/envoy-gateway.md).
func runRatelimit(getenv func(string) string, stderr io.Writer) int {
	e, err := ratelimitenv.Read(getenv)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit (sluice):", err)
		return 2
	}
	log, err := newLogger(&config{logLevel: e.LogLevel(), logFormat: e.LogFormat()}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit (sluice): $LOG_LEVEL or $LOG_FORMAT:", err)
		return 2
	}
	if h, ok := log.Handler().(*logthrottle.Handler); ok {
		defer h.Close()
	}
	for _, u := range e.Unsupported() {
		log.Warn("envoyproxy/ratelimit setting not supported by sluice; it has no effect", "setting", u)
	}
	server.SetRedisLogger(log)
	if getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit(memory.DefaultMaxBytes))
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	files, seedOnly := listFlag(e.PolicyFiles()), e.SeedOnly()
	seed, _ := policy.NewSet()
	var sources []policystore.Source
	if len(files) > 0 {
		if seed, sources, err = readPolicies(files, seedOnly); err != nil {
			log.Error("invalid rate limit configuration: fix the files named below", "policy", files.String(), "error", err.Error())
			return 2
		}
	}
	cfg, err := e.Config(log)
	if err != nil {
		log.Error("ratelimit environment", "error", err.Error())
		return 2
	}
	cfg.Policies, cfg.PolicyFiles = seed, sources
	if tc, on := e.Tracing(); on {
		tr, err := tracing.New(context.Background(), tc)
		if err != nil {
			log.Error("tracing", "error", err.Error())
			return 2
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tr.Shutdown(sctx); err != nil {
				log.Warn("tracing: spans not exported at shutdown", "error", err.Error())
			}
		}()
		cfg.Tracer = tr
		log.Info("tracing ShouldRateLimit with OpenTelemetry", "protocol", tc.Protocol, "endpoint", e.TracingEndpoint(),
			"sampling_rate", tc.SamplingRate, "service", tc.ServiceName)
	}
	var srv *server.Server
	loaded := func() bool { return srv.RLS().Policies().Len() > 0 } // for HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	cfg.ExtraHTTP = e.Endpoints(func() (bool, string) { return srv.Ready() }, func() bool { return loaded() },
		func() *policy.Set { return srv.RLS().Policies() }, func(domain string) string { return srv.Owner(domain) })
	if srv, err = server.New(cfg); err != nil {
		log.Error("cannot start", "error", e.ListenerVars(err).Error())
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if e.XDS() {
		client, err := e.XDSClient(srv.SetOverlay, srv.Registry(), log)
		if err != nil {
			log.Error("xDS configuration source", "error", err.Error())
			return 2
		}
		loaded = func() bool {
			select {
			case <-client.Loaded():
				return true
			default:
				return false
			}
		}
		done := make(chan struct{})
		go func() { defer close(done); client.Run(ctx) }()
		defer func() { stop(); <-done }()
		if !waitForXDS(ctx, e, client, log) {
			return 0
		}
	}
	// The policy files are re-applied on SIGHUP, and when they change if
	// RUNTIME_WATCH_ROOT is true; an xDS-owned domain in them is refused.
	changed := make(chan struct{}, 1)
	if e.RuntimeWatch() && len(files) > 0 {
		t := time.NewTicker(runtimeWatchInterval)
		defer t.Stop()
		go watchPolicies(ctx, t.C, files, changed)
	}
	go reloadOnHangup(ctx, hup, changed, log, policyFiles{files, seedOnly}, srv.Policies())
	log.Info("running as envoyproxy/ratelimit (CONFIG_TYPE="+e.ConfigType()+")",
		"grpc", srv.GRPCAddr(), "healthcheck", srv.ExtraHTTPAddr("healthcheck"), "debug", srv.ExtraHTTPAddr("debug"), "metrics", srv.HTTPAddr())
	if err := srv.Run(ctx); err != nil {
		log.Error("serving failed", "error", err.Error())
		return 1
	}
	return 0
}

// waitForXDS waits for the first configuration from the xDS server unless
// FORCE_START_WITHOUT_INITIAL_CONFIG says to serve without it; it reports
// false when ctx ended first.
func waitForXDS(ctx context.Context, e *ratelimitenv.Env, client *xdsconfig.Client, log *slog.Logger) bool {
	if e.ForceStart() {
		log.Info("serving before the first xDS configuration (FORCE_START_WITHOUT_INITIAL_CONFIG=true): until it comes every domain is unknown, and requests for unknown domains are answered OK")
		return true
	}
	log.Info("waiting for the first configuration from the xDS server before serving (FORCE_START_WITHOUT_INITIAL_CONFIG=false)", "server", e.XDSServer())
	select {
	case <-client.Loaded():
		return true
	case <-ctx.Done():
		return false
	}
}
