package rlqs

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Demand keeps, per bucket (a key), the demand each Envoy reported for it,
// so that every replica of the control plane sizes its Envoys' shares
// against all the Envoys of the bucket, whichever replica they talk to.
type Demand interface {
	// Report records envoy's demand for key (requests per second; +Inf
	// when unknown), valid until now+ttl, and returns the demand of every
	// Envoy of key whose report is still valid, envoy's included.
	Report(ctx context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration) (map[string]float64, error)
	// Forget removes envoy's demand from keys (its stream ended).
	Forget(ctx context.Context, keys []string, envoy string) error
}

// maxEnvoys bounds the Envoys one bucket's demand keeps: past it the
// reports of new Envoys are not recorded (their shares are computed as if
// they were, against the others).
const maxEnvoys = 4096

// MemoryDemand is a Demand in this process: the embedded store's, and the
// fallback while Redis does not answer.
type MemoryDemand struct {
	mu   sync.Mutex
	keys map[string]map[string]demandEntry
}

type demandEntry struct {
	demand  float64
	expires time.Time
}

// NewMemoryDemand returns an empty MemoryDemand.
func NewMemoryDemand() *MemoryDemand {
	return &MemoryDemand{keys: map[string]map[string]demandEntry{}}
}

// Report implements Demand. It also drops key's expired reports.
func (m *MemoryDemand) Report(_ context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration) (map[string]float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	envoys := m.keys[key]
	if envoys == nil {
		envoys = map[string]demandEntry{}
		m.keys[key] = envoys
	}
	if _, ok := envoys[envoy]; ok || len(envoys) < maxEnvoys {
		envoys[envoy] = demandEntry{demand: demand, expires: now.Add(ttl)}
	}
	out := make(map[string]float64, len(envoys)+1)
	for id, e := range envoys {
		if !now.Before(e.expires) {
			delete(envoys, id)
			continue
		}
		out[id] = e.demand
	}
	out[envoy] = demand
	return out, nil
}

// Forget implements Demand.
func (m *MemoryDemand) Forget(_ context.Context, keys []string, envoy string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		delete(m.keys[k], envoy)
		if len(m.keys[k]) == 0 {
			delete(m.keys, k)
		}
	}
	return nil
}

// Len returns how many buckets m holds demand for.
func (m *MemoryDemand) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

// RedisDemand is a Demand in Redis: one hash per bucket, a field per
// Envoy holding "demand expiry-in-unix-ms". Redis 7.0 has no per-field
// expiry, so readers skip (and delete) expired fields, and the hash as a
// whole expires 2 TTLs after its last report.
type RedisDemand struct {
	client redis.UniversalClient
}

// NewRedisDemand returns a Demand in Redis.
func NewRedisDemand(c redis.UniversalClient) *RedisDemand { return &RedisDemand{client: c} }

// Report implements Demand in one round trip (plus one to delete expired
// fields, when there are some).
func (r *RedisDemand) Report(ctx context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration) (map[string]float64, error) {
	val := strconv.FormatFloat(demand, 'g', -1, 64) + " " + strconv.FormatInt(now.Add(ttl).UnixMilli(), 10)
	var all *redis.MapStringStringCmd
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, envoy, val)
		p.PExpire(ctx, key, 2*ttl)
		all = p.HGetAll(ctx, key)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rlqs: demand of %s: %w", key, err)
	}
	out := make(map[string]float64, len(all.Val()))
	var expired []string
	nowMs := now.UnixMilli()
	for id, v := range all.Val() {
		d, exp, ok := parseDemand(v)
		if !ok || exp <= nowMs {
			expired = append(expired, id)
			continue
		}
		if len(out) < maxEnvoys || id == envoy {
			out[id] = d
		}
	}
	if len(expired) > 0 {
		r.client.HDel(ctx, key, expired...) // best effort: readers skip them anyway
	}
	out[envoy] = demand
	return out, nil
}

// parseDemand reads one hash field's value.
func parseDemand(v string) (demand float64, expiresMs int64, ok bool) {
	d, e, found := strings.Cut(v, " ")
	if !found {
		return 0, 0, false
	}
	demand, err1 := strconv.ParseFloat(d, 64)
	expiresMs, err2 := strconv.ParseInt(e, 10, 64)
	if err1 != nil || err2 != nil || math.IsNaN(demand) || demand < 0 {
		return 0, 0, false
	}
	return demand, expiresMs, true
}

// Forget implements Demand.
func (r *RedisDemand) Forget(ctx context.Context, keys []string, envoy string) error {
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.HDel(ctx, k, envoy)
		}
		return nil
	})
	return err
}
