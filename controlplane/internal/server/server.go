package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/internal/degrade"
	"github.com/sluicehq/sluice/controlplane/internal/invalidarg"
	"github.com/sluicehq/sluice/controlplane/internal/lease"
	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/internal/tracing"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// Redis modes.
const (
	ModeMemory     = "memory"     // no Redis: the embedded memory store
	ModeStandalone = "standalone" // one Redis server
	ModeSentinel   = "sentinel"   // Redis Sentinel: MasterName and sentinel Addrs
	ModeCluster    = "cluster"    // Redis Cluster: seed Addrs
)

// Defaults for Config.
const (
	DefaultGRPCAddr        = "127.0.0.1:8081"
	DefaultHTTPAddr        = "127.0.0.1:9090"
	DefaultPolicyAddr      = "127.0.0.1:8082"
	DefaultShutdownTimeout = 10 * time.Second
	DefaultSweepInterval   = time.Second
)

// The decision port's gRPC servers (Config.GRPCServer).
//
// GRPCServerUnary is package grpcunary: cleartext HTTP/2 with the unary
// methods ShouldRateLimit and grpc.health.v1.Health/Check only, at a
// fraction of grpc-go's CPU per call. GRPCServerGo is grpc-go's server
// with the same services plus Health/Watch; pick it when something on the
// decision port needs more of gRPC than that.
const (
	GRPCServerUnary = "unary"
	GRPCServerGo    = "grpc-go"
)

// DecisionServers lists the values of Config.GRPCServer.
var DecisionServers = []string{GRPCServerUnary, GRPCServerGo}

// RedisConfig says how to reach Redis.
type RedisConfig struct {
	// Mode is ModeMemory, ModeStandalone, ModeSentinel or ModeCluster; ""
	// means ModeStandalone when Addrs is set, else ModeMemory.
	Mode string
	// Addrs: the server (standalone), the sentinels (sentinel) or seed
	// nodes (cluster), as host:port.
	Addrs []string
	// MasterName is the Sentinel master name (sentinel mode).
	MasterName string
	// Username and Password authenticate to Redis (and to the sentinels).
	Username, Password string
	// DB selects the database (standalone and sentinel).
	DB int
	// NoFunctions runs the scripts by EVALSHA only (see
	// redisstore.Options.NoFunctions).
	NoFunctions bool
	// TLS, when set, reaches Redis over TLS (the sentinels too).
	TLS *redisstore.TLS
}

// Config configures a Server. Zero values take the defaults.
type Config struct {
	// GRPCAddr is the decision service's listen address; DefaultGRPCAddr
	// if empty. Port 0 picks a free port (see Server.GRPCAddr).
	GRPCAddr string
	// GRPCServer picks the decision port's gRPC server: GRPCServerUnary
	// (also when empty) or GRPCServerGo. See DecisionServers.
	GRPCServer string
	// GRPCTLS, when set, serves the decision port over TLS (see
	// DecisionTLSConfig; mTLS with ClientCAs); nil: plaintext h2c.
	GRPCTLS *tls.Config
	// HTTPAddr is the metrics and health listen address; DefaultHTTPAddr
	// if empty.
	HTTPAddr string
	// Redis says where state lives.
	Redis RedisConfig
	// PolicyFiles are the policy files, which own their domains: they are
	// put in force at start (the newest files win, see
	// policystore.SourceState), and ratectl cannot change their domains.
	PolicyFiles []policystore.Source
	// Policies seeds an empty policy store (the embedded example, or
	// policy files that seed only); nil means none. Once the store holds
	// anything (policies applied through the policy service, by this
	// replica or another), the store wins.
	Policies *policy.Set
	// PolicyAddr is the policy service's listen address; DefaultPolicyAddr
	// if empty. The decision API stays on GRPCAddr, unauthenticated.
	PolicyAddr string
	// PolicyAuth says which credentials the policy service accepts. With
	// no token, no client CA and AllowUnauthenticated off, the policy
	// service is not served at all (logged).
	PolicyAuth policyservice.AuthConfig
	// PolicyLimits bound the policy service's Applies and Watches in
	// flight; zero fields take policyservice's defaults.
	PolicyLimits policyservice.Limits
	// PolicyTLS, when set, serves the policy listener over TLS; with
	// PolicyAuth.ClientCAs it verifies client certificates (mTLS).
	PolicyTLS *tls.Config
	// PolicyFile is where policies live without Redis, written
	// atomically. Empty means a file in a temporary directory removed at
	// shutdown: run-time changes then last as long as the process. With
	// Redis, policies live in Redis and PolicyFile must be empty.
	PolicyFile string
	// Deadline bounds each Redis decision before the memory store answers
	// instead; 0 means degrade.DefaultDeadline.
	Deadline time.Duration
	// ProbeInterval is how often a degraded server pings Redis; 0 means
	// degrade.DefaultProbeInterval.
	ProbeInterval time.Duration
	// Trip says which Redis failures switch to the memory store (a single
	// one is answered locally without switching); zero means its defaults.
	Trip degrade.Trip
	// MaxDescriptors bounds the descriptors of one request; 0 means
	// rls.DefaultMaxDescriptors.
	MaxDescriptors int
	// NearLimitRatio and MaxRuleValues configure the per-rule statistics
	// (see rls.Options); 0 means their defaults.
	NearLimitRatio float64
	MaxRuleValues  int
	// ChargePastLimit, QuotaMode, ResponseMetadata and CalendarMonths are
	// rls.Options'.
	ChargePastLimit  bool
	QuotaMode        bool
	ResponseMetadata bool
	CalendarMonths   *calendar.Calendar
	// MemoryMaxEntries and MemoryMaxBytes bound the memory store; 0 means
	// its defaults.
	MemoryMaxEntries int
	MemoryMaxBytes   int64
	// SettleDedupeTTL is how long a settlement's token is remembered
	// (x-sluice-settle: applied at most once within it), by Redis and by
	// the memory store; 0 means 15 minutes.
	SettleDedupeTTL time.Duration
	// SettleMaxTokens bounds the settlement tokens this replica has the
	// store remember within SettleDedupeTTL, shared fairly among its
	// clients (see rls.Options.SettleTokens); 0 means
	// rls.DefaultSettleTokens with Redis, and the memory store's own bound
	// (memory.DefaultMaxOnce) without, so that it never drops one.
	SettleMaxTokens int64
	// ShutdownTimeout bounds the graceful drain; 0 means
	// DefaultShutdownTimeout. Calls still running then are cut.
	ShutdownTimeout time.Duration
	// Pprof serves net/http/pprof under /debug/pprof/ on the HTTP
	// listener, for profiling; off by default.
	Pprof bool
	// Bounds bound the decision port's connections in both server modes
	// (see unaryOptions and grpcBounds for how they apply); its
	// HandshakeTimeout, FirstCallTimeout and IdleTimeout bound every
	// listener's (the policy, RLQS and HTTP listeners take
	// connbounds.Default's other bounds, with Operator's and RLQS' own).
	// Zero fields take connbounds.Default's. At their connection caps the
	// listeners close the connection without calls in flight that is due
	// to close soonest for want of calls, to take the new one.
	Bounds connbounds.Bounds
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// RLQSAddr, when set, serves Envoy's Rate Limit Quota Service there
	// (package rlqs), with RLQS and RLQSServer's settings.
	RLQSAddr   string
	RLQS       rlqs.Options
	RLQSServer rlqs.ServerConfig
	// OverlayOwner, when set, names what owns the domains given to
	// SetOverlay (e.g. "the xDS server localhost:18001"): those domains
	// are served from the overlay whatever the policy store holds, and the
	// policy store refuses to apply or delete them, naming the owner.
	OverlayOwner string
	// Tracer, when set, traces ShouldRateLimit calls (package tracing);
	// nil traces nothing and costs nothing.
	Tracer *tracing.Tracer
	// ExtraHTTP are more HTTP listeners, bounded and shut down as the
	// metrics listener is (envoyproxy/ratelimit's health and debug ports).
	ExtraHTTP []HTTPEndpoint
}

// HTTPEndpoint is one more HTTP listener: its name (for the connection
// metrics), address and handler.
type HTTPEndpoint struct {
	Name, Addr string
	Handler    http.Handler
}

// Server is one control-plane process.
type Server struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry

	memory   *memory.Store
	degrade  *degrade.Store        // nil in memory mode
	lease    *lease.Store          // nil in memory mode
	replicas atomic.Int64          // active replicas, for lease sizes
	client   redis.UniversalClient // nil in memory mode
	store    store.Store           // what decisions use
	service  *rls.Service
	policies *policystore.Store
	tempDir  string       // PolicyFile's directory when the server made it
	polGRPC  *grpc.Server // the policy service; nil when it is off
	polLn    net.Listener
	grpc     decisionServer // the decision port's server
	health   *health.Server
	http     *http.Server
	grpcLn   net.Listener
	httpLn   net.Listener
	bounds   *GRPCBounds // the grpc-go decision server's; nil for the unary server
	serving  atomic.Bool // between Run's start and its shutdown
	runOnce  sync.Once
	shutdown time.Duration
	rlqs     *rlqsPart // nil unless RLQSAddr is set
	extra    []extraHTTP
	policySet
}

// New builds a Server and opens its listeners; Run serves them. On error
// nothing is left open.
func New(cfg Config) (*Server, error) {
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = DefaultGRPCAddr
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = DefaultHTTPAddr
	}
	switch cfg.GRPCServer {
	case "":
		cfg.GRPCServer = GRPCServerUnary
	case GRPCServerUnary, GRPCServerGo:
	default:
		return nil, fmt.Errorf("server: GRPCServer %q: want one of %s", cfg.GRPCServer, strings.Join(DecisionServers, ", "))
	}
	if cfg.ShutdownTimeout < 0 || cfg.Deadline < 0 || cfg.ProbeInterval < 0 {
		return nil, errors.New("server: ShutdownTimeout, Deadline and ProbeInterval must not be negative")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, registry: prometheus.NewRegistry(), shutdown: cfg.ShutdownTimeout}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.shutdown == 0 {
		s.shutdown = DefaultShutdownTimeout
	}
	if err := s.build(); err != nil {
		s.closeResources()
		return nil, err
	}
	return s, nil
}

// build makes the parts of s and opens its listeners.
func (s *Server) build() error {
	cfg := s.cfg
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s.memory = memory.New(memory.Options{MaxEntries: cfg.MemoryMaxEntries, MaxBytes: cfg.MemoryMaxBytes, OnceTTL: cfg.SettleDedupeTTL})
	s.registerMemoryMetrics()
	if err := s.buildStore(); err != nil {
		return err
	}
	if err := s.buildPolicies(); err != nil {
		return err
	}
	s.storeSet = s.policies.Current().Set
	var err error
	s.service, err = rls.New(s.store, s.policies.Current().Set, rls.Options{
		MaxDescriptors:   cfg.MaxDescriptors,
		NearLimitRatio:   cfg.NearLimitRatio,
		MaxRuleValues:    cfg.MaxRuleValues,
		Logger:           s.log,
		ChargePastLimit:  cfg.ChargePastLimit,
		QuotaMode:        cfg.QuotaMode,
		ResponseMetadata: cfg.ResponseMetadata,
		CalendarMonths:   cfg.CalendarMonths,
		Registerer:       s.registry,
		Quota:            s.quota(),
		SettleTokens:     s.settleTokens(),
		SettleTTL:        cfg.SettleDedupeTTL,
	})
	if err != nil {
		return err
	}

	s.health = health.NewServer()
	if cfg.GRPCServer == GRPCServerGo {
		b := grpcBounds(cfg)
		s.bounds = &b
		opts := decisionServerOptions(s.service, b, s.newStreamBudget(b.SharedStreams, b.BodyTimeout))
		var creds credentials.TransportCredentials
		if cfg.GRPCTLS != nil {
			creds = credentials.NewTLS(cfg.GRPCTLS)
		}
		opts = append(opts, grpc.Creds(s.guard(creds, "decision")))
		if cfg.Tracer != nil {
			opts = append(opts, grpc.ChainUnaryInterceptor(traceInterceptor(cfg.Tracer)))
		}
		gs := grpc.NewServer(opts...)
		// invalidarg: a request that does not decode is InvalidArgument, as
		// in unary mode (decisionServerOptions installs its codec).
		gs.RegisterService(invalidarg.Service(&rlsv3.RateLimitService_ServiceDesc), s.service)
		gs.RegisterService(invalidarg.Service(&healthpb.Health_ServiceDesc), s.health)
		s.grpc = gs
	} else {
		u := newUnaryServer(s.service, s.health, unaryOptions(cfg), s.log, cfg.Tracer)
		s.registerUnaryStats(u.Server)
		s.grpc = u
	}
	s.setHealth()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.readyz)
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s.http = s.httpServer(mux)

	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return fmt.Errorf("server: gRPC address %s: %w", cfg.GRPCAddr, err)
	}
	if s.bounds != nil {
		s.grpcLn = s.evicting(s.limit(s.grpcLn, "decision", s.bounds.MaxConns), "decision", s.bounds.IdleTimeout, s.bounds.FirstCallTimeout)
	}
	s.grpcLn = s.decisionListener(s.grpcLn)
	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return fmt.Errorf("server: HTTP address %s: %w", cfg.HTTPAddr, err)
	}
	// On the HTTP listener a connection that has been answered is not
	// worth more than a new one (a client that asks for /metrics again
	// and again and never reads its answers looks answered): the idlest
	// goes first, by its last activity alone.
	first := s.cfg.listenerBounds().FirstCallTimeout
	s.httpLn = s.evicting(s.limit(s.httpLn, "http", connbounds.OperatorMaxConns), "http", first, first)
	if err := s.buildExtraHTTP(); err != nil {
		return err
	}
	if err := s.buildRLQS(); err != nil {
		return err
	}
	return s.buildPolicyService()
}

// buildPolicies opens the policy store: in Redis when the server has Redis
// (every replica converges on it), else in a local file. The policy files
// are put in force; the seed seeds an empty store only.
func (s *Server) buildPolicies() error {
	var backend policystore.Backend
	var err error
	switch {
	case s.client != nil && s.cfg.PolicyFile != "":
		return errors.New("server: with Redis, policies live in Redis: leave the policy file empty")
	case s.client != nil:
		backend, err = policystore.NewRedis(s.client, policystore.RedisOptions{})
	default:
		path := s.cfg.PolicyFile
		if path == "" {
			if s.tempDir, err = os.MkdirTemp("", "sluice-policies-"); err != nil {
				return fmt.Errorf("server: policy store: %w", err)
			}
			path = filepath.Join(s.tempDir, "policies.json")
			s.log.Warn("policies applied at run time (ratectl) last only until this process ends: without Redis they are kept in a temporary file; set -policy-file to keep them",
				"file", path)
		}
		backend, err = policystore.NewFile(path)
	}
	if err != nil {
		return err
	}
	opts := policystore.Options{Files: s.cfg.PolicyFiles, Seed: s.cfg.Policies, Logger: s.log}
	if s.cfg.OverlayOwner != "" {
		opts.Owner = s.overlayOwner
	}
	s.policies, err = policystore.New(context.Background(), backend, opts)
	return err
}

// buildPolicyService mounts the policy service on its own listener, behind
// the authenticator, unless no credential is configured.
func (s *Server) buildPolicyService() error {
	a := s.cfg.PolicyAuth
	if len(a.Tokens) == 0 && a.ClientCAs == nil && !a.AllowUnauthenticated {
		s.log.Warn("policy service off: no token and no client CA configured (set $SLUICE_TOKEN or -policy-token-file to change policies at run time)")
		return nil
	}
	if a.Logger == nil {
		a.Logger = s.log
	}
	auth, err := policyservice.NewAuthenticator(a)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	b := s.cfg.listenerBounds().Operator(policystore.MaxPolicySize + 64<<10)
	var creds credentials.TransportCredentials
	if s.cfg.PolicyTLS != nil {
		creds = credentials.NewTLS(s.cfg.PolicyTLS)
	}
	svc := policyservice.New(s.policies, policyservice.Options{Logger: s.log, Overlay: s.overlaySet, Limits: s.cfg.PolicyLimits})
	// The codec sends the answers the service shares as they were encoded
	// once; invalidarg: a request that does not decode is InvalidArgument.
	opts := append(policyServerOptions(auth, svc, b, s.guard(creds, "policy")),
		grpc.ForceServerCodecV2(svc.Codec(invalidarg.Codec(encoding.GetCodecV2(grpcproto.Name)))))
	s.polGRPC = grpc.NewServer(opts...)
	s.polGRPC.RegisterService(invalidarg.Service(&sluicev1.PolicyService_ServiceDesc), svc)
	addr := s.cfg.PolicyAddr
	if addr == "" {
		addr = DefaultPolicyAddr
	}
	if s.polLn, err = net.Listen("tcp", addr); err != nil {
		return fmt.Errorf("server: policy address %s: %w", addr, err)
	}
	s.polLn = s.evicting(s.limit(s.polLn, "policy", b.MaxConns), "policy", b.IdleTimeout, b.FirstCallTimeout)
	return nil
}

// listenerBounds are the bounds every listener starts from: Config.Bounds'
// timeouts (handshake, first call, idle) on connbounds.Default's other
// bounds.
func (c *Config) listenerBounds() connbounds.Bounds {
	b := c.Bounds.WithDefaults()
	return connbounds.Bounds{HandshakeTimeout: b.HandshakeTimeout, FirstCallTimeout: b.FirstCallTimeout, IdleTimeout: b.IdleTimeout}.WithDefaults()
}

// GRPCAddr returns the gRPC listener's address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// HTTPAddr returns the HTTP listener's address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// RLS returns the decision service (to swap its policies).
func (s *Server) RLS() *rls.Service { return s.service }

// PolicyAddr returns the policy service's address, or "" when it is off.
func (s *Server) PolicyAddr() string {
	if s.polLn == nil {
		return ""
	}
	return s.polLn.Addr().String()
}

// Policies returns the policy store.
func (s *Server) Policies() *policystore.Store { return s.policies }

// Registry returns the Prometheus registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// RedisClient returns the Redis client, or nil in memory mode.
func (s *Server) RedisClient() redis.UniversalClient { return s.client }

// domainNames lists a policy set's domains.
func domainNames(set *policy.Set) []string {
	var names []string
	for _, d := range set.Domains() {
		names = append(names, d.Name)
	}
	return names
}
