package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/controlplane/internal/lease"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
)

// Lease timing: how often unused token_bucket/gcra leases are looked at
// (and given back), and how often a replica says it is alive.
const (
	leaseSweepInterval = 10 * time.Millisecond
	heartbeatInterval  = time.Second
	// replicasKey is a sorted set of replica ids scored by their last
	// heartbeat (Unix ms): the replicas leases are sized for.
	replicasKey = "sluice:{lease}:replicas"
)

// buildLease puts the lease layer in front of the Redis store: it acts only
// on limits whose policy says `lease: auto`.
func (s *Server) buildLease(primary *redisstore.Store) (*lease.Store, error) {
	s.replicas.Store(1)
	l, err := lease.New(primary, lease.Options{Replicas: func() int { return int(s.replicas.Load()) }})
	if err != nil {
		return nil, err
	}
	stat := func(name, help string, f func(lease.Stats) int64) {
		s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(l.Stats())) }))
	}
	stat("sluice_lease_local_decisions_total", "Requests of leased limits answered from this replica's leases (no Redis call of their own).",
		func(st lease.Stats) int64 { return st.Local })
	stat("sluice_lease_calls_total", "Lease script round trips.", func(st lease.Stats) int64 { return st.LeaseCalls })
	stat("sluice_lease_granted_units_total", "Units leased from Redis.", func(st lease.Stats) int64 { return st.Granted })
	stat("sluice_lease_shared_units_total", "Units handed to filters (RLS quota).", func(st lease.Stats) int64 { return st.Shared })
	stat("sluice_lease_returned_units_total", "Unspent token_bucket/gcra units given back to Redis.", func(st lease.Stats) int64 { return st.Returned })
	stat("sluice_lease_expired_units_total", "Leased units that expired unspent (the under-admission leases caused).", func(st lease.Stats) int64 { return st.Expired })
	stat("sluice_lease_shares_total", "Shares of a lease handed to filters (RLS quota).", func(st lease.Stats) int64 { return st.Shares })
	stat("sluice_lease_late_units_total", "Units of lease calls answered after their check's deadline, kept for later checks.",
		func(st lease.Stats) int64 { return st.Late })
	for r := range lease.Unleased(len(lease.Stats{}.Unleased)) {
		s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_lease_unleased_checks_total",
			Help:        "Checks of leased limits decided per request in Redis, by why no lease answered them.",
			ConstLabels: prometheus.Labels{"reason": r.String()}},
			func() float64 { return float64(l.Stats().Unleased[r]) }))
	}
	for r := range lease.Unshared(len(lease.Stats{}.Unshared)) {
		s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_lease_unshared_total",
			Help:        "Allowed answers to filters that carried no quota, by why.",
			ConstLabels: prometheus.Labels{"reason": r.String()}},
			func() float64 { return float64(l.Stats().Unshared[r]) }))
	}
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_lease_outstanding_units",
		Help: "Units this replica holds in leases now (at most that many admissions could be lost)."},
		func() float64 { return float64(l.Stats().Outstanding) }))
	return l, nil
}

// runLease sweeps the leases and keeps the replica count fresh until ctx
// ends.
func (s *Server) runLease(ctx context.Context) {
	go s.lease.Run(ctx, leaseSweepInterval)
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// No heartbeat (and no key in Redis) until a leased limit is used.
	t := time.NewTicker(heartbeatInterval / 10)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			if !last.IsZero() {
				hctx, cancel := context.WithTimeout(context.Background(), heartbeatInterval)
				s.client.ZRem(hctx, replicasKey, id)
				cancel()
			}
			return
		case <-t.C:
		}
		if time.Since(last) >= heartbeatInterval && s.lease.Active() {
			s.heartbeat(ctx, id)
			last = time.Now()
		}
	}
}

// heartbeat records this replica and counts the replicas seen within three
// heartbeats. On failure the last count stays.
func (s *Server) heartbeat(ctx context.Context, id string) {
	hctx, cancel := context.WithTimeout(ctx, heartbeatInterval)
	defer cancel()
	now := time.Now().UnixMilli()
	var n *redis.IntCmd
	_, err := s.client.TxPipelined(hctx, func(p redis.Pipeliner) error {
		p.ZAdd(hctx, replicasKey, redis.Z{Score: float64(now), Member: id})
		p.ZRemRangeByScore(hctx, replicasKey, "-inf", "("+strconv.FormatInt(now-3*heartbeatInterval.Milliseconds(), 10))
		p.PExpire(hctx, replicasKey, 10*heartbeatInterval)
		n = p.ZCard(hctx, replicasKey)
		return nil
	})
	if err == nil && n.Val() > 0 {
		s.replicas.Store(n.Val())
	}
}

// quota is what the decision service shares leases through (nil without
// Redis).
func (s *Server) quota() rls.Sharer {
	if s.lease == nil {
		return nil
	}
	return s.lease
}
