package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/logthrottle"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/internal/tracing"
	"github.com/sluicehq/sluice/controlplane/internal/xdsconfig"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// runtimeWatchInterval is how often the runtime directory is checked when
// RUNTIME_WATCH_ROOT is true.
const runtimeWatchInterval = time.Second

// runRatelimit is run for the binary named ratelimit: envoyproxy/ratelimit's
// environment instead of sluice's flags (see docs/envoy-gateway.md).
func runRatelimit(getenv func(string) string, stderr io.Writer) int {
	e, err := readRatelimitEnv(getenv)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit (sluice):", err)
		return 2
	}
	log, err := newLogger(&config{logLevel: e.logLevel, logFormat: e.logFormat}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit (sluice): $LOG_LEVEL or $LOG_FORMAT:", err)
		return 2
	}
	if h, ok := log.Handler().(*logthrottle.Handler); ok {
		defer h.Close()
	}
	for _, u := range unsupportedSet(getenv) {
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

	// The policy files: the runtime directory (FILE), or with xDS only
	// $SLUICE_POLICY's, for domains beside the xDS-owned ones.
	var files listFlag
	if e.configType == configTypeFile {
		files.Set(e.runtimeDir())
	} else if v := getenv("SLUICE_POLICY"); v != "" {
		files.Set(v)
	}
	// The files own their domains, as envoyproxy/ratelimit's are the
	// truth at every start; $SLUICE_POLICY_SEED_ONLY=true makes them seed
	// an empty store only.
	seedOnly := getenv("SLUICE_POLICY_SEED_ONLY") == "true"
	seed, _ := policy.NewSet()
	var sources []policystore.Source
	if len(files) > 0 {
		if seed, sources, err = readPolicies(files, seedOnly); err != nil {
			log.Error("invalid rate limit configuration: fix the files named below", "policy", files.String(), "error", err.Error())
			return 2
		}
	}
	cfg, err := e.serverConfig(getenv, log)
	if err != nil {
		log.Error("ratelimit environment", "error", err.Error())
		return 2
	}
	cfg.Policies, cfg.PolicyFiles = seed, sources
	if e.tracing.enabled {
		tr, err := tracing.New(context.Background(), tracing.Config{Protocol: e.tracing.protocol,
			ServiceName: e.tracing.serviceName, ServiceNamespace: e.tracing.namespace, InstanceID: e.tracing.inst,
			SamplingRate: e.tracing.samplingRate})
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
		log.Info("tracing ShouldRateLimit with OpenTelemetry", "protocol", e.tracing.protocol, "endpoint", e.tracing.endpoint,
			"sampling_rate", e.tracing.samplingRate, "service", e.tracing.serviceName)
	}
	var loaded func() bool // for HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	var srv *server.Server
	cfg.ExtraHTTP = []server.HTTPEndpoint{
		{Name: "healthcheck", Addr: addr(e.host, e.port), Handler: healthHandler(func() (bool, string) {
			ok, why := srv.Ready()
			if ok && e.healthyWithConfig && !loaded() {
				return false, "no rate limit configuration loaded yet"
			}
			return ok, why
		})},
		{Name: "debug", Addr: addr(e.debugHost, e.debugPort), Handler: debugHandler(func() *policy.Set { return srv.RLS().Policies() },
			func(domain string) string { return srv.Owner(domain) })},
	}
	if srv, err = server.New(cfg); err != nil {
		log.Error("cannot start", "error", e.listenerVars(err).Error())
		return 2
	}
	loaded = func() bool { return srv.RLS().Policies().Len() > 0 }

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var client *xdsconfig.Client
	if e.configType == configTypeXDS {
		if client, err = e.xdsClient(srv, log); err != nil {
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
		if !e.forceStart {
			log.Info("waiting for the first configuration from the xDS server before serving (FORCE_START_WITHOUT_INITIAL_CONFIG=false)", "server", e.xds.serverURL)
			select {
			case <-client.Loaded():
			case <-ctx.Done():
				return 0
			}
		} else {
			log.Info("serving before the first xDS configuration (FORCE_START_WITHOUT_INITIAL_CONFIG=true): until it comes every domain is unknown, and requests for unknown domains are answered OK")
		}
	}
	// The policy files are re-applied on SIGHUP, and when they change if
	// RUNTIME_WATCH_ROOT is true; an xDS-owned domain in them is refused.
	changed := make(chan struct{}, 1)
	if e.runtimeWatch && len(files) > 0 {
		t := time.NewTicker(runtimeWatchInterval)
		defer t.Stop()
		go watchPolicies(ctx, t.C, files, changed)
	}
	go reloadOnHangup(ctx, hup, changed, log, policyFiles{files, seedOnly}, srv.Policies())
	log.Info("running as envoyproxy/ratelimit (CONFIG_TYPE="+e.configType+")",
		"grpc", srv.GRPCAddr(), "healthcheck", srv.ExtraHTTPAddr("healthcheck"), "debug", srv.ExtraHTTPAddr("debug"), "metrics", srv.HTTPAddr())
	if err := srv.Run(ctx); err != nil {
		log.Error("serving failed", "error", err.Error())
		return 1
	}
	return 0
}

// serverConfig maps the environment to the server's configuration.
func (e *rlEnv) serverConfig(getenv func(string) string, log *slog.Logger) (server.Config, error) {
	mode, addrs, master, err := e.redis()
	if err != nil {
		return server.Config{}, err
	}
	if mode == "memory" {
		log.Warn("no REDIS_URL: counters live in this process's memory store (one replica's view)")
	}
	user, password := e.redisUser()
	var redisTLS *redisstore.TLS
	if e.redisTLS || e.redisCert != "" || e.redCA != "" {
		redisTLS = &redisstore.TLS{CAFile: e.redCA, CertFile: e.redisCert, KeyFile: e.redisKey}
	}
	var grpcTLS *tls.Config
	if e.grpcTLS {
		if grpcTLS, err = server.DecisionTLSConfig(e.grpcCert, e.grpcKey, e.clientCA()); err != nil {
			return server.Config{}, err
		}
		if e.grpcSAN != "" && e.clientCA() != "" {
			server.RequireClientSAN(grpcTLS, e.grpcSAN)
		}
		if ca := e.clientCA(); ca != "" {
			log.Info("decision port: mutual TLS, client certificates checked against "+ca, "GRPC_CLIENT_TLS_CACERT", e.grpcClientCA, "GRPC_SERVER_TLS_CA_CERT", e.grpcServerCA)
		}
	}
	httpAddr := "127.0.0.1:0"
	if e.usePrometheus {
		httpAddr = e.prometheusAddr
	}
	c := &config{}
	auth, policyTLS, err := policyAuth(c, getenv)
	if err != nil {
		return server.Config{}, err
	}
	cfg := server.Config{
		GRPCAddr: addr(e.grpcHost, e.grpcPort),
		GRPCTLS:  grpcTLS,
		HTTPAddr: httpAddr,
		Redis: server.RedisConfig{Mode: mode, Addrs: addrs, MasterName: master, Username: user, Password: password,
			TLS: redisTLS},
		PolicyAddr:     orEnv(getenv, "SLUICE_POLICY_ADDR", server.DefaultPolicyAddr),
		PolicyAuth:     auth,
		PolicyTLS:      policyTLS,
		NearLimitRatio: e.nearLimitRatio,
		Logger:         log,
		RLQS:           rlqs.Options{},
	}
	if e.configType == configTypeXDS {
		cfg.OverlayOwner = "the xDS server " + e.xds.serverURL + " (CONFIG_TYPE=GRPC_XDS_SOTW)"
	}
	return cfg, nil
}

// xdsClient builds the xDS configuration source from CONFIG_GRPC_XDS_*.
func (e *rlEnv) xdsClient(srv *server.Server, log *slog.Logger) (*xdsconfig.Client, error) {
	x := e.xds
	var tc *tls.Config
	if x.useTLS {
		tc = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.san}
		if x.ca != "" {
			pool, err := tlsfiles.CertPool(x.ca)
			if err != nil {
				return nil, fmt.Errorf("$CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
			}
			tc.RootCAs = pool
		}
		if x.cert != "" {
			pair, err := tlsfiles.LoadKeyPair(x.cert, x.key)
			if err != nil {
				return nil, fmt.Errorf("$CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY: %w", err)
			}
			tc.GetClientCertificate = pair.GetClientCertificate
		}
	}
	return xdsconfig.New(xdsconfig.Options{
		ServerURL: x.serverURL, NodeID: x.nodeID, NodeMetadata: x.nodeMetadata, Headers: x.headers,
		TLS: tc, Backoff: x.backoff, MaxMsgSize: x.maxMsgSize,
		Apply: srv.SetOverlay, Logger: log, Registerer: srv.Registry(),
	})
}

// healthHandler serves /healthcheck as envoyproxy/ratelimit does: 200 "OK"
// while serving, 500 while starting, draining or otherwise not ready.
func healthHandler(ready func() (bool, string)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready(); !ok {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, why+"\n")
			return
		}
		io.WriteString(w, "OK")
	})
	return mux
}

// debugHandler serves /rlconfig: every domain in force, as policy YAML,
// each after a comment naming its owner (owner: the policy file, or
// xds:<resource>; "" is the policy store's, changed with ratectl).
func debugHandler(current func() *policy.Set, owner func(domain string) string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, d := range current().Domains() {
			o := owner(d.Name)
			if o == "" {
				o = "the policy store (ratectl)"
			}
			y, err := policy.Marshal(d)
			if err != nil {
				fmt.Fprintf(w, "# domain %q, owner %s: %v\n", d.Name, o, err)
				continue
			}
			fmt.Fprintf(w, "# domain %q, owner %s\n---\n%s", d.Name, o, y)
		}
	})
	return mux
}

func orEnv(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}
