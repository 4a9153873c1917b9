package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// ReportInterval is how often Envoy 1.40 reports, whatever its
// reporting_interval says.
const ReportInterval = 5 * time.Second

// Defaults for Options.
const (
	DefaultMaxBuckets = 1024
	// DefaultMaxBucketBytes bounds what the buckets of all streams hold
	// (see BucketCost): 128 MiB, about 80,000 buckets of short ids, 17,000
	// at MaxBucketIDBytes.
	DefaultMaxBucketBytes = 128 << 20
	DefaultTTL            = 3 * ReportInterval
	DefaultHeadroom       = 0.05
	DefaultFloor          = 1.0
	// MaxEntries bounds a bucket id's entries, MaxEntryLen each key and
	// value, and MaxBucketIDBytes all of its keys and values together.
	MaxEntries       = 64
	MaxEntryLen      = 1024
	MaxBucketIDBytes = 4096
	// MaxDomainLen bounds a report's domain.
	MaxDomainLen = 256
)

// budgetTime is how much of a limit's rate the usage bucket in the store
// holds: two report intervals, so that Envoys whose shares sum to the rate
// never find it empty.
const budgetTime = 2 * ReportInterval

// Options configures a Service. Zero values take the defaults.
type Options struct {
	// MaxBuckets bounds the buckets one stream may have: reports of more
	// buckets get no assignment for them (Envoy applies its
	// no_assignment_behavior) and are counted in
	// sluice_rlqs_buckets_refused_total.
	MaxBuckets int
	// MaxBucketBytes bounds the bytes the buckets of all streams hold
	// together (BucketCost each), shared fairly among the clients (the
	// connections): past a client's share, its new buckets are refused the
	// same way, and a client under its share that finds none free takes
	// room from the client most over its share, whose stream is told to
	// abandon buckets.
	MaxBucketBytes int64
	// TTL is the assignments' time to live, in whole seconds (at least
	// 2 s); DefaultTTL (3 report intervals) survives two missed reports.
	TTL time.Duration
	// Headroom and Floor size the demand an Envoy is assumed to have (see
	// Want): DefaultHeadroom and DefaultFloor (requests per second).
	Headroom, Floor float64
	// Demand keeps the Envoys' demand; nil keeps it in this process.
	Demand Demand
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives the service's logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Service serves RateLimitQuotaService.StreamRateLimitQuotas.
type Service struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	store    store.Store
	demand   Demand
	local    *MemoryDemand // when demand fails (Redis down), and without Redis
	opts     Options
	log      *slog.Logger
	policies atomic.Pointer[policy.Set]
	m        metrics
	budget   *bucketBudget
	draining atomic.Bool // Drain was called: closed streams keep their shares

	mu      sync.Mutex
	streams map[*stream]struct{}
	clients map[string]*client // by peer address: one per connection
}

// New returns a Service deciding from st with the given policies (nil
// means none).
func New(st store.Store, policies *policy.Set, opts Options) (*Service, error) {
	if st == nil {
		return nil, errors.New("rlqs: store is nil")
	}
	if opts.MaxBuckets < 0 || opts.MaxBucketBytes < 0 || opts.TTL < 0 || opts.Headroom < 0 || opts.Floor < 0 {
		return nil, errors.New("rlqs: MaxBuckets, MaxBucketBytes, TTL, Headroom and Floor must not be negative")
	}
	if opts.MaxBucketBytes == 0 {
		opts.MaxBucketBytes = DefaultMaxBucketBytes
	}
	if opts.MaxBuckets == 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL%time.Second != 0 || opts.TTL < 2*time.Second {
		return nil, errors.New("rlqs: TTL must be whole seconds, at least 2s (Envoy reads only its seconds)")
	}
	if opts.Headroom == 0 {
		opts.Headroom = DefaultHeadroom
	}
	if opts.Floor == 0 {
		opts.Floor = DefaultFloor
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Service{store: st, opts: opts, log: opts.Logger, local: NewMemoryDemand(),
		streams: map[*stream]struct{}{}, clients: map[string]*client{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.demand = opts.Demand
	if s.demand == nil {
		s.demand = s.local
	}
	s.m = newMetrics(opts.Registerer, s.streamCount)
	s.budget = newBucketBudget(opts.MaxBucketBytes, s.shed)
	s.SetPolicies(policies)
	return s, nil
}

// Register registers the service on r.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlqspb.RegisterRateLimitQuotaServiceServer(r, s) }

// stream is one Envoy's stream.
type stream struct {
	id      string  // identifies the Envoy in the shared demand
	client  *client // its connection's share of the bucket budget
	srv     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer
	sendMu  sync.Mutex
	mu      sync.Mutex // guards what follows
	domain  string
	buckets map[bucketKey]*bucket
	warned  bool // a refused bucket logged
}

// bucket is one bucket of a stream. It keeps its id's entries (the only
// copy of the id; the map key is their digest) and what its assignments
// need.
type bucket struct {
	entries   []store.Entry // sorted by key
	cost      int64         // BucketCost, held in the bucket budget
	last      time.Time     // last report (zero before the first)
	demandKey string        // where its demand lives; "" without a limit
	hadLimit  bool          // a limit applied at the last report
	sent      TokenBucket   // the token bucket last assigned; zero after a blanket rule
	prepaid   int64         // usage already charged for a loan (see Lend)
}

func (st *stream) send(r *rlqspb.RateLimitQuotaResponse) error {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	return st.srv.Send(r)
}

// StreamRateLimitQuotas serves one Envoy: every report is answered with an
// assignment for each of its buckets. A malformed report ends the stream
// with InvalidArgument and changes nothing.
func (s *Service) StreamRateLimitQuotas(srv rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	st := s.openStream(srv, peerAddr(srv.Context()))
	defer s.closeStream(st)
	for {
		rep, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := s.handle(srv.Context(), st, rep)
		if err != nil {
			s.m.badReports.Inc()
			s.log.Warn("rlqs: refused a usage report", "error", err.Error())
			return err
		}
		if len(resp.GetBucketAction()) > 0 {
			if err := st.send(resp); err != nil {
				return err
			}
		}
	}
}

// peerAddr names a stream's client: its connection's remote address.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// openStream registers a new stream of the client at addr.
func (s *Service) openStream(srv rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, addr string) *stream {
	st := &stream{id: newID(), srv: srv, buckets: map[bucketKey]*bucket{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[addr]
	if c == nil {
		c = &client{addr: addr, streams: map[*stream]struct{}{}}
		s.clients[addr] = c
	}
	c.streams[st] = struct{}{}
	st.client = c
	s.streams[st] = struct{}{}
	return st
}

// closeStream forgets a stream and releases what its buckets held: their
// bytes in the bucket budget, and (unless the service drains) their
// Envoy's entries in the demand, so that the shares it held are free for
// the others at once. The Envoy of a closed stream is mostly gone (a
// restart, a scale-down); one whose stream broke reopens it at its next
// report, and the usage budget bounds what it admits meanwhile on its last
// assignment (see the package doc).
func (s *Service) closeStream(st *stream) {
	s.mu.Lock()
	delete(s.streams, st)
	c := st.client
	delete(c.streams, st)
	if len(c.streams) == 0 {
		delete(s.clients, c.addr)
	}
	s.mu.Unlock()
	st.mu.Lock()
	keys := make([]string, 0, len(st.buckets))
	var bytes int64
	for _, b := range st.buckets {
		bytes += b.cost
		if b.demandKey != "" {
			keys = append(keys, b.demandKey)
		}
	}
	st.buckets = nil
	st.mu.Unlock()
	s.budget.release(c, bytes)
	var until time.Time // at once
	if s.draining.Load() {
		// Its Envoy reopens a stream elsewhere at its next report.
		until = s.opts.Now().Add(ReportInterval + time.Second)
	}
	s.release(st, keys, until)
}

// Drain makes the streams that close from now on keep their shares for
// one more report interval instead of releasing them at once: call it
// before ending the streams of a server that stops, whose Envoys go on
// with their assignments and reopen a stream on another replica at their
// next report.
func (s *Service) Drain() { s.draining.Store(true) }

// release releases st's Envoy's entries in keys (buckets it abandoned or
// closed) at until (zero: at once).
func (s *Service) release(st *stream, keys []string, until time.Time) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.local.Release(ctx, keys, st.id, until)
	if s.demand != s.local {
		if err := s.demand.Release(ctx, keys, st.id, until); err != nil {
			s.log.Debug("rlqs: cannot forget a closed or abandoned bucket's Envoy (its entry expires)", "error", err.Error())
		}
	}
}

func (s *Service) streamCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// newID returns a random id for a stream.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
