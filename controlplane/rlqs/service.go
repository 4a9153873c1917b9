// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService), the protocol of
// Envoy's own envoy.filters.http.rate_limit_quota filter, from sluice's
// policies and store.
//
// An Envoy keeps one stream open and reports, per bucket, the requests it
// allowed and denied; the service answers each report with an assignment
// per bucket. A bucket id's entries are a request descriptor: sorted by key,
// they are matched against the policy of the report's domain
// (policy.Domain.Match). The limit's rate (requests_per_unit per unit) is
// divided among the Envoys that report the bucket, by max-min fairness over
// their reported demand (Shares), cut to what the other Envoys' assignments
// still in force leave free (Allot), and each Envoy gets a token bucket of
// its share: the assignments in force never sum past the rate. The Envoys'
// demand and assignments are kept in Redis when the control plane has
// Redis (RedisDemand), so that replicas divide one rate among all the
// Envoys; the usage each Envoy reports is debited from a token bucket of
// the limit's rate in the store, and an Envoy whose usage finds that bucket
// empty (the budget is spent) is told to deny all until its next report.
//
// Envoy 1.40 reports every 5 s whatever reporting_interval says, reads only
// the seconds of assignment_time_to_live and of token_bucket.fill_interval,
// and ignores requests_per_time_unit: assignments are token buckets or
// blanket rules with whole-second intervals and time-to-live values of
// several report intervals (Options.TTL). A token bucket means the same rate
// to Envoy and to a client that reads token_bucket.proto literally (see
// TokenBucket). Only a stream's first report must carry its domain.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// ReportInterval is how often Envoy 1.40 reports, whatever its
// reporting_interval says.
const ReportInterval = 5 * time.Second

// Defaults for Options.
const (
	DefaultMaxBuckets = 1024
	// DefaultMaxTotalBuckets bounds the buckets of all streams together
	// (a few hundred bytes each).
	DefaultMaxTotalBuckets = 1 << 18
	DefaultTTL             = 3 * ReportInterval
	DefaultHeadroom        = 0.05
	DefaultFloor           = 1.0
	// MaxEntries bounds a bucket id's entries, and MaxEntryLen each key and
	// value.
	MaxEntries  = 64
	MaxEntryLen = 1024
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
	// MaxTotalBuckets bounds the buckets of all streams together, the
	// same way.
	MaxTotalBuckets int
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

	buckets atomic.Int64 // of all streams

	mu      sync.Mutex
	streams map[*stream]struct{}
}

// New returns a Service deciding from st with the given policies (nil
// means none).
func New(st store.Store, policies *policy.Set, opts Options) (*Service, error) {
	if st == nil {
		return nil, errors.New("rlqs: store is nil")
	}
	if opts.MaxBuckets < 0 || opts.MaxTotalBuckets < 0 || opts.TTL < 0 || opts.Headroom < 0 || opts.Floor < 0 {
		return nil, errors.New("rlqs: MaxBuckets, MaxTotalBuckets, TTL, Headroom and Floor must not be negative")
	}
	if opts.MaxTotalBuckets == 0 {
		opts.MaxTotalBuckets = DefaultMaxTotalBuckets
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
	s := &Service{store: st, opts: opts, log: opts.Logger, local: NewMemoryDemand(), streams: map[*stream]struct{}{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.demand = opts.Demand
	if s.demand == nil {
		s.demand = s.local
	}
	s.m = newMetrics(opts.Registerer, s.streamCount)
	s.SetPolicies(policies)
	return s, nil
}

// Register registers the service on r.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlqspb.RegisterRateLimitQuotaServiceServer(r, s) }

// stream is one Envoy's stream.
type stream struct {
	id      string // identifies the Envoy in the shared demand
	srv     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer
	sendMu  sync.Mutex
	mu      sync.Mutex // guards what follows
	domain  string
	buckets map[string]*bucket // by canonical id (bucketKey)
	warned  bool               // MaxBuckets logged
}

// bucket is one bucket of a stream.
type bucket struct {
	id        *rlqspb.BucketId
	entries   []store.Entry // sorted by key
	last      time.Time     // last report (zero before the first)
	demandKey string        // where its demand lives; "" without a limit
	hadLimit  bool          // a limit applied at the last report
	sent      TokenBucket   // the token bucket last assigned; zero after a blanket rule
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
	st := &stream{id: newID(), srv: srv, buckets: map[string]*bucket{}}
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.mu.Unlock()
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

// closeStream forgets a stream. Its Envoy's entries stay in the demand
// store until they expire: the Envoy keeps its assignments until their
// time-to-live, whether it reconnects (as a new stream) or not.
func (s *Service) closeStream(st *stream) {
	s.mu.Lock()
	delete(s.streams, st)
	s.mu.Unlock()
	st.mu.Lock()
	s.buckets.Add(-int64(len(st.buckets)))
	st.buckets = nil
	st.mu.Unlock()
}

// forget removes st's Envoy from keys (buckets it abandoned).
func (s *Service) forget(st *stream, keys []string) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.local.Forget(ctx, keys, st.id)
	if s.demand != s.local {
		if err := s.demand.Forget(ctx, keys, st.id); err != nil {
			s.log.Debug("rlqs: cannot forget an abandoned bucket's Envoy (its entry expires)", "error", err.Error())
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

// handle answers one usage report of st's Envoy.
func (s *Service) handle(ctx context.Context, st *stream, rep *rlqspb.RateLimitQuotaUsageReports) (*rlqspb.RateLimitQuotaResponse, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := validate(rep, st.domain); err != nil {
		return nil, err
	}
	if st.domain == "" {
		st.domain = rep.GetDomain() // a later report may leave it out
	}
	s.m.reports.Inc()
	now := s.opts.Now()
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, u := range rep.GetBucketQuotaUsages() {
		entries := sortedEntries(u.GetBucketId().GetBucket())
		key := bucketKey(entries)
		b := st.buckets[key]
		if b == nil {
			if len(st.buckets) >= s.opts.MaxBuckets || s.buckets.Add(1) > int64(s.opts.MaxTotalBuckets) {
				if len(st.buckets) < s.opts.MaxBuckets {
					s.buckets.Add(-1)
				}
				s.m.refused.Inc()
				if !st.warned {
					st.warned = true
					s.log.Warn("rlqs: more buckets than allowed (per stream or in all): the new ones get no assignment",
						"max_buckets", s.opts.MaxBuckets, "max_total_buckets", s.opts.MaxTotalBuckets, "domain", st.domain)
				}
				continue
			}
			b = &bucket{id: &rlqspb.BucketId{Bucket: u.GetBucketId().GetBucket()}, entries: entries}
			st.buckets[key] = b
		}
		demand := math.Inf(1) // unknown until two reports
		total := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
		switch elapsed := now.Sub(b.last); {
		case !b.last.IsZero() && elapsed > 0:
			demand = total / elapsed.Seconds()
		case u.GetTimeElapsed().AsDuration() > 0: // whole seconds, may be 0
			demand = total / u.GetTimeElapsed().AsDuration().Seconds()
		}
		b.last = now
		resp.BucketAction = append(resp.BucketAction, s.assign(ctx, st, b, demand, int64(min(u.GetNumRequestsAllowed(), math.MaxInt64)), now))
	}
	return resp, nil
}
