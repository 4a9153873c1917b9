package rlqs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Envoy is what the demand store keeps of one Envoy for one bucket.
type Envoy struct {
	// Demand is its demand in requests per second; +Inf when unknown.
	Demand float64
	// Assigned is the rate it was last assigned (requests per second): in
	// force at that Envoy until its time-to-live ends.
	Assigned float64
}

// Demand keeps, per bucket (a key), each Envoy's demand and the rate in
// force at it, so that every replica of the control plane sizes its
// Envoys' shares against all the Envoys of the bucket, whichever replica
// they talk to.
type Demand interface {
	// Assign records envoy's demand for key, calls decide with every Envoy
	// of key whose entry is still valid (envoy's included, with its new
	// demand and its previous assignment), and records decide's result as
	// envoy's assignment, valid until now+ttl. No other Assign on key comes
	// between the read and the write.
	Assign(ctx context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration, decide func(map[string]Envoy) float64) (float64, error)
	// Release makes envoy's entries in keys expire at until, unless they
	// expire sooner; a zero until removes them at once (Envoy abandoned
	// the buckets, or its stream closed).
	Release(ctx context.Context, keys []string, envoy string, until time.Time) error
}

// maxEnvoys bounds the Envoys one bucket keeps: past it new Envoys are
// decided against the others but not recorded.
const maxEnvoys = 4096

// MemoryDemand is a Demand in this process: without Redis, and while
// Redis does not answer.
type MemoryDemand struct {
	mu    sync.Mutex
	keys  map[string]map[string]memoryEnvoy
	swept time.Time
}

type memoryEnvoy struct {
	Envoy
	expires time.Time
}

// NewMemoryDemand returns an empty MemoryDemand.
func NewMemoryDemand() *MemoryDemand {
	return &MemoryDemand{keys: map[string]map[string]memoryEnvoy{}}
}

// Assign implements Demand. Once per ttl it also drops every expired entry.
func (m *MemoryDemand) Assign(_ context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration, decide func(map[string]Envoy) float64) (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Sub(m.swept) >= ttl {
		m.sweep(now)
	}
	envoys := m.keys[key]
	all := make(map[string]Envoy, len(envoys)+1)
	for id, e := range envoys {
		if !now.Before(e.expires) {
			delete(envoys, id)
			continue
		}
		all[id] = e.Envoy
	}
	me := Envoy{Demand: demand, Assigned: all[envoy].Assigned}
	all[envoy] = me
	me.Assigned = decide(all)
	if envoys == nil {
		envoys = map[string]memoryEnvoy{}
		m.keys[key] = envoys
	}
	if _, ok := envoys[envoy]; ok || len(envoys) < maxEnvoys {
		envoys[envoy] = memoryEnvoy{Envoy: me, expires: now.Add(ttl)}
	}
	return me.Assigned, nil
}

// sweep drops expired entries and empty keys.
func (m *MemoryDemand) sweep(now time.Time) {
	m.swept = now
	for k, envoys := range m.keys {
		for id, e := range envoys {
			if !now.Before(e.expires) {
				delete(envoys, id)
			}
		}
		if len(envoys) == 0 {
			delete(m.keys, k)
		}
	}
}

// Release implements Demand.
func (m *MemoryDemand) Release(_ context.Context, keys []string, envoy string, until time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		e, ok := m.keys[k][envoy]
		switch {
		case !ok:
		case until.IsZero():
			delete(m.keys[k], envoy)
		case until.Before(e.expires):
			e.expires = until
			m.keys[k][envoy] = e
		}
		if len(m.keys[k]) == 0 {
			delete(m.keys, k)
		}
	}
	return nil
}

// Len returns how many buckets m holds.
func (m *MemoryDemand) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

// RedisDemand is a Demand in Redis: one hash per bucket, a field per Envoy
// holding "demand assigned expiry-in-unix-ms". Redis 7.0 has no per-field
// expiry, so readers skip (and delete) expired fields, and the hash as a
// whole expires 2 TTLs after its last write. Assign is an optimistic
// transaction (WATCH, then MULTI/EXEC), retried when another replica wrote
// the bucket in between.
type RedisDemand struct {
	client redis.UniversalClient
}

// NewRedisDemand returns a Demand in Redis.
func NewRedisDemand(c redis.UniversalClient) *RedisDemand { return &RedisDemand{client: c} }

// assignAttempts bounds the optimistic transaction's attempts.
const assignAttempts = 8

// Assign implements Demand.
func (r *RedisDemand) Assign(ctx context.Context, key, envoy string, demand float64, now time.Time, ttl time.Duration, decide func(map[string]Envoy) float64) (float64, error) {
	var assigned float64
	nowMs := now.UnixMilli()
	txf := func(tx *redis.Tx) error {
		fields, err := tx.HGetAll(ctx, key).Result()
		if err != nil {
			return err
		}
		all := make(map[string]Envoy, len(fields)+1)
		var expired []string
		for id, v := range fields {
			e, exp, ok := parseEnvoy(v)
			if !ok || exp <= nowMs {
				expired = append(expired, id)
				continue
			}
			all[id] = e
		}
		_, known := all[envoy]
		me := Envoy{Demand: demand, Assigned: all[envoy].Assigned}
		all[envoy] = me
		assigned = decide(all)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(expired) > 0 {
				p.HDel(ctx, key, expired...)
			}
			if known || len(all) <= maxEnvoys {
				p.HSet(ctx, key, envoy, formatEnvoy(Envoy{Demand: demand, Assigned: assigned}, now.Add(ttl).UnixMilli()))
			}
			p.PExpire(ctx, key, 2*ttl)
			return nil
		})
		return err
	}
	for range assignAttempts {
		err := r.client.Watch(ctx, txf, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue // another replica wrote the bucket: decide again
		}
		if err != nil {
			return 0, fmt.Errorf("rlqs: demand of %s: %w", key, err)
		}
		return assigned, nil
	}
	return 0, fmt.Errorf("rlqs: demand of %s: %d writers in a row came in between", key, assignAttempts)
}

// formatEnvoy writes one hash field's value.
func formatEnvoy(e Envoy, expiresMs int64) string {
	return strconv.FormatFloat(e.Demand, 'g', -1, 64) + " " + strconv.FormatFloat(e.Assigned, 'g', -1, 64) + " " + strconv.FormatInt(expiresMs, 10)
}

// parseEnvoy reads one hash field's value.
func parseEnvoy(v string) (e Envoy, expiresMs int64, ok bool) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return e, 0, false
	}
	var err [3]error
	e.Demand, err[0] = strconv.ParseFloat(f[0], 64)
	e.Assigned, err[1] = strconv.ParseFloat(f[1], 64)
	expiresMs, err[2] = strconv.ParseInt(f[2], 10, 64)
	if errors.Join(err[:]...) != nil || math.IsNaN(e.Demand) || e.Demand < 0 ||
		math.IsNaN(e.Assigned) || math.IsInf(e.Assigned, 0) || e.Assigned < 0 {
		return e, 0, false
	}
	return e, expiresMs, true
}

// Release implements Demand. Only envoy's replica writes envoy's fields,
// and its stream has ended, so a read and a write suffice.
func (r *RedisDemand) Release(ctx context.Context, keys []string, envoy string, until time.Time) error {
	if until.IsZero() {
		_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.HDel(ctx, k, envoy)
			}
			return nil
		})
		return err
	}
	cmds := make([]*redis.StringCmd, len(keys))
	if _, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HGet(ctx, k, envoy)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	untilMs := until.UnixMilli()
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			if e, exp, ok := parseEnvoy(cmds[i].Val()); ok && untilMs < exp {
				p.HSet(ctx, k, envoy, formatEnvoy(e, untilMs))
			}
		}
		return nil
	})
	return err
}
