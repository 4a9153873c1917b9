package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/controlplane/internal/degrade"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// buildStore makes the memory store, or Redis behind the degradation
// wrapper with the memory store as the rescue limiter.
func (s *Server) buildStore() error {
	rc := s.cfg.Redis
	mode := rc.Mode
	if mode == "" {
		mode = ModeMemory
		if len(rc.Addrs) > 0 {
			mode = ModeStandalone
		}
	}
	deadline := s.cfg.Deadline
	if deadline == 0 {
		deadline = degrade.DefaultDeadline
	}
	// Round trips end near the decision deadline, so a stalled Redis frees
	// its connections quickly; dials are retried by the prober, not here.
	ioTimeout := max(2*deadline, 50*time.Millisecond)
	dialTimeout := max(10*deadline, 250*time.Millisecond)
	var dialer func(context.Context, string, string) (net.Conn, error)
	var tlsConfig *tls.Config
	if rc.TLS != nil && mode != ModeMemory {
		var err error
		if dialer, tlsConfig, err = rc.TLS.Dialer(dialTimeout); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	switch mode {
	case ModeMemory:
		if len(rc.Addrs) > 0 || rc.MasterName != "" || rc.TLS != nil {
			return errors.New("server: redis mode memory takes no Redis addresses, master name or TLS")
		}
		s.store = s.memory
		return nil
	case ModeStandalone:
		if len(rc.Addrs) != 1 {
			return fmt.Errorf("server: redis mode standalone needs exactly one address (got %d)", len(rc.Addrs))
		}
		s.client = redis.NewClient(&redis.Options{
			Addr: rc.Addrs[0], Username: rc.Username, Password: rc.Password, DB: rc.DB,
			ContextTimeoutEnabled: true, DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout,
			DialerRetries: 1, Dialer: dialer, TLSConfig: tlsConfig,
		})
	case ModeSentinel:
		if rc.MasterName == "" || len(rc.Addrs) == 0 {
			return errors.New("server: redis mode sentinel needs the master name and at least one sentinel address")
		}
		s.client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: rc.MasterName, SentinelAddrs: rc.Addrs,
			Username: rc.Username, Password: rc.Password, SentinelUsername: rc.Username, SentinelPassword: rc.Password, DB: rc.DB,
			ContextTimeoutEnabled: true, DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout,
			DialerRetries: 1, Dialer: dialer, TLSConfig: tlsConfig,
		})
	case ModeCluster:
		if len(rc.Addrs) == 0 {
			return errors.New("server: redis mode cluster needs at least one seed address")
		}
		if rc.DB != 0 {
			return errors.New("server: redis mode cluster has no databases: leave db at 0")
		}
		s.client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: rc.Addrs, Username: rc.Username, Password: rc.Password,
			ContextTimeoutEnabled: true, DialTimeout: dialTimeout, ReadTimeout: ioTimeout, WriteTimeout: ioTimeout,
			DialerRetries: 1, Dialer: dialer, TLSConfig: tlsConfig,
		})
	default:
		return fmt.Errorf("server: unknown redis mode %q (use memory, standalone, sentinel or cluster)", mode)
	}
	// One script round trip at a time: calls that arrive meanwhile leave
	// together in the next one. Fewer, bigger script calls cost Redis and
	// this process less CPU per decision (each call has a fixed cost on
	// both sides), which on a busy host is also what bounds throughput.
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_store_redis_duration_seconds",
		Help:    "Time of one Redis script round trip (the checks of every decision batched into it).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50 µs .. 1.6 s
	})
	s.registry.MustRegister(latency)
	primary, err := redisstore.New(s.client, redisstore.Options{MaxInFlight: 1, NoFunctions: rc.NoFunctions, OnceTTL: s.cfg.SettleDedupeTTL,
		RoundTrip: func(d time.Duration) { latency.Observe(d.Seconds()) }})
	if err != nil {
		return err
	}
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_redis_script_functions",
		Help: "1 while the Redis scripts run as a function library (FCALL); 0 while they run by EVALSHA: " +
			"the library not loaded yet, FUNCTION LOAD refused (Redis before 7, an ACL), or flushed.",
	}, func() float64 {
		if primary.Functions() {
			return 1
		}
		return 0
	}))
	if s.lease, err = s.buildLease(primary); err != nil {
		return err
	}
	s.degrade, err = degrade.New(s.lease, s.memory, degrade.Options{
		Probe:         s.ping,
		Deadline:      deadline,
		TrustContext:  true, // redisstore.Decide returns when its context ends
		ProbeInterval: s.cfg.ProbeInterval,
		Trip:          s.cfg.Trip,
		OnChange:      func(bool) { s.setHealth() },
		Logger:        s.log,
		Registerer:    s.registry,
	})
	if err != nil {
		return err
	}
	s.store = s.degrade
	return nil
}

// ping checks Redis: every master on a Cluster, else the server.
func (s *Server) ping(ctx context.Context) error {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
	}
	return s.client.Ping(ctx).Err()
}

// registerMemoryMetrics exports the memory store's counters.
func (s *Server) registerMemoryMetrics() {
	stat := func(f func(memory.Stats) float64) func() float64 {
		return func() float64 { return f(s.memory.Stats()) }
	}
	s.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_memory_entries", Help: "Keys held by the memory store."},
			stat(func(st memory.Stats) float64 { return float64(st.Entries) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_memory_bytes", Help: "Approximate bytes held by the memory store."},
			stat(func(st memory.Stats) float64 { return float64(st.Bytes) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_memory_evictions_total", Help: "Live memory-store entries dropped to respect its bounds."},
			stat(func(st memory.Stats) float64 { return float64(st.Evicted) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_memory_expired_total", Help: "Expired memory-store entries swept."},
			stat(func(st memory.Stats) float64 { return float64(st.Expired) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_memory_settle_tokens", Help: "Settlement tokens the memory store remembers as applied (at most 100,000)."},
			stat(func(st memory.Stats) float64 { return float64(st.Once) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_memory_settle_tokens_dropped_total", Help: "Settlement tokens the memory store forgot before their TTL to stay within its bound (a retry of one would be charged again)."},
			stat(func(st memory.Stats) float64 { return float64(st.OnceDropped) })),
	)
}

// SetRedisLogger routes go-redis's internal log lines (one per failed dial
// while Redis is down, for instance) to l at debug level.
func SetRedisLogger(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }

// redisLogger adapts slog to go-redis's logger interface.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// settleTokens is the settlement token budget (Config.SettleMaxTokens):
// without Redis, at most what the memory store remembers.
func (s *Server) settleTokens() int64 {
	n := s.cfg.SettleMaxTokens
	if s.client == nil && (n == 0 || n > memory.DefaultMaxOnce) {
		n = memory.DefaultMaxOnce
	}
	return n
}
