package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

var (
	//go:embed lease.lua
	leaseLua string
	//go:embed return.lua
	returnLua string
)

// leaseSource and returnSource are the scripts Lease and Return run (see
// lease.lua and return.lua). They are EVALSHAs, not part of the function
// library: one lease stands for many admissions, so its fixed cost is
// shared, and the decision library stays as measured.
var (
	leaseSource  = preludeLua + fixedWindowLua + slidingWindowLua + tokenBucketLua + gcraLua + leaseLua
	returnSource = preludeLua + returnLua
	leaseSHA     = sha(leaseSource)
	returnSHA    = sha(returnSource)
)

func sha(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// Leasable reports whether a limit of algorithm a can be leased:
// fixed_window, sliding_window, token_bucket and gcra. A sliding log
// records the time of every admission, which a lease taken in advance
// cannot know.
func Leasable(a algorithms.Kind) bool {
	return a == algorithms.KindFixedWindow || a == algorithms.KindSlidingWindow || a == algorithms.KindTokenBucket || a == algorithms.KindGCRA
}

// Returnable reports whether unspent units of a lease of algorithm a can be
// given back (token_bucket and gcra; a window's units expire with it).
func Returnable(a algorithms.Kind) bool {
	return a == algorithms.KindTokenBucket || a == algorithms.KindGCRA
}

// LeaseRequest asks for up to Want units of Key's limit, to be spent within
// Longest at most.
type LeaseRequest struct {
	Key     string
	Limit   store.Limit
	Want    int64         // at least 1; more than the limit's capacity asks for all of it
	Longest time.Duration // the longest validity wanted; at least a microsecond
}

// Lease is what Store.Lease granted for one LeaseRequest. The Granted
// units are debited in Redis already: spending them is admitting that many
// requests (of cost 1) within Valid of the moment the call was sent. A
// Lease of 0 units is a refusal, as a request of cost 1 would have been.
type Lease struct {
	Granted    int64         // 0 when the limit has nothing left
	Remaining  int64         // what Redis has left after the debit
	RetryAfter time.Duration // when Granted is 0: until a request of 1 would pass
	ResetAfter time.Duration // until the limiter is full again
	Valid      time.Duration // how long the units may be spent
	End        int64         // the lease's end on Redis's clock (microseconds), for Return
}

// Returned gives back Units unspent units of a token_bucket or gcra lease
// that ends at End (Lease.End). The caller must have stopped spending it.
type Returned struct {
	Key   string
	Limit store.Limit
	Units int64
	End   int64
}

// markSuffix names a key's lease mark (see lease.lua): the key's own hash
// tag is its whole identity, so the mark is in the same slot.
const markSuffix = ":lease"

// leaseAnswer is how many integers lease.lua answers per key.
const leaseAnswer = 6

// Lease debits and grants leases, one script call per hash slot, all in one
// round trip. Like decisions, the calls are never retried (a lease that
// ran twice would debit twice). out[i] receives reqs[i]'s lease.
func (s *Store) Lease(ctx context.Context, reqs []LeaseRequest, out []Lease) error {
	if len(out) != len(reqs) {
		return fmt.Errorf("redisstore: %d leases for %d requests", len(out), len(reqs))
	}
	args := make([][]int64, len(reqs))
	keys := make([]string, len(reqs))
	clock := s.clock()
	for i, r := range reqs {
		w, err := encode(store.Check{Key: r.Key, Limit: r.Limit, Cost: 1}, clock)
		if err != nil {
			return fmt.Errorf("redisstore: lease %d: %w: %w", i, store.ErrInvalidLimit, err)
		}
		if !Leasable(r.Limit.Algorithm) {
			return fmt.Errorf("redisstore: lease %d: %s cannot be leased", i, r.Limit.Algorithm)
		}
		if r.Want < 1 {
			return fmt.Errorf("redisstore: lease %d: want %d units", i, r.Want)
		}
		longest := min(max(int64(r.Longest/time.Microsecond), 1), maxSpan)
		keys[i] = r.Key
		b := calendarValues(w.lim.cal)
		args[i] = []int64{w.lim.alg, w.lim.p1, w.lim.p2, w.lim.p3, min(r.Want, w.limit), longest, b[0], b[1], b[2], b[3], b[4], b[5]}
	}
	vals, err := s.perKey(ctx, leaseSHA, leaseSource, keys, args, leaseAnswer)
	if err != nil {
		return fmt.Errorf("redisstore: lease: %w", err)
	}
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	for i := range reqs {
		v := vals[i]
		switch v[0] {
		case badState:
			return fmt.Errorf("redisstore: lease: key %.80q holds a value sluice did not write", reqs[i].Key)
		case badClock:
			return fmt.Errorf("redisstore: lease: key %.80q: Redis's clock is more than a calendar period away from this replica's", reqs[i].Key)
		}
		out[i] = Lease{Granted: v[0], Remaining: v[1], RetryAfter: us(v[2]), ResetAfter: us(v[3]), Valid: us(v[4]), End: v[5]}
	}
	return nil
}

// Return gives back unspent units of token_bucket and gcra leases (see
// return.lua). It returns how many keys got units back: a lease that ended
// before the script ran gives nothing back.
func (s *Store) Return(ctx context.Context, rets []Returned) (int, error) {
	args := make([][]int64, len(rets))
	keys := make([]string, len(rets))
	for i, r := range rets {
		w, err := encode(store.Check{Key: r.Key, Limit: r.Limit}, 0) // token_bucket and gcra: no calendar
		if err != nil {
			return 0, fmt.Errorf("redisstore: return %d: %w: %w", i, store.ErrInvalidLimit, err)
		}
		if !Returnable(r.Limit.Algorithm) {
			return 0, fmt.Errorf("redisstore: return %d: %s leases are not returned", i, r.Limit.Algorithm)
		}
		keys[i] = r.Key
		args[i] = []int64{w.lim.alg, w.lim.p1, w.lim.p2, w.lim.p3, min(max(r.Units, 0), maxSpan), min(max(r.End, 0), maxNow)}
	}
	vals, err := s.perKey(ctx, returnSHA, returnSource, keys, args, 1)
	if err != nil {
		return 0, fmt.Errorf("redisstore: return: %w", err)
	}
	n := 0
	var bad error
	for i, v := range vals {
		switch v[0] {
		case 1:
			n++
		case badState:
			bad = errors.Join(bad, fmt.Errorf("key %.80q holds a value sluice did not write", keys[i]))
		}
	}
	if bad != nil {
		return n, fmt.Errorf("redisstore: return: %w", bad)
	}
	return n, nil
}

// perKey runs a script that takes the same number of arguments per key
// (args[i], after the clock) and answers per integers per key, in calls of
// at most MaxBatch keys of one hash slot, sent in one round trip. It
// answers each key's integers.
func (s *Store) perKey(ctx context.Context, sha, src string, keys []string, args [][]int64, per int) ([][]int64, error) {
	var now any = ""
	if s.now != nil {
		now = s.now().UnixMicro()
	}
	groups := map[string][]int{}
	var order []string
	for i, k := range keys {
		tag := ""
		if !s.single {
			tag = hashTag(k)
		}
		if _, ok := groups[tag]; !ok {
			order = append(order, tag)
		}
		groups[tag] = append(groups[tag], i)
	}
	var cmds []*scriptCmd
	var idx [][]int
	for _, tag := range order {
		g := groups[tag]
		for len(g) > 0 {
			n := min(len(g), s.maxBatch)
			a := make([]any, 0, 4+n*(2+len(args[g[0]])))
			a = append(a, "evalsha", sha, 2*n)
			for _, i := range g[:n] {
				a = append(a, keys[i], keys[i]+markSuffix)
			}
			a = append(a, now)
			for _, i := range g[:n] {
				for _, v := range args[i] {
					a = append(a, v)
				}
			}
			cmds = append(cmds, &scriptCmd{cmd: newCmd(ctx, a), args: a})
			idx = append(idx, g[:n])
			g = g[n:]
		}
	}
	s.runScript(ctx, cmds, src)
	out := make([][]int64, len(keys))
	for c, sc := range cmds {
		vals, err := sc.cmd.Result()
		if err != nil {
			return nil, err
		}
		if len(vals) != per*len(idx[c]) {
			return nil, fmt.Errorf("script answered %d integers for %d keys", len(vals), len(idx[c]))
		}
		for k, i := range idx[c] {
			out[i] = vals[k*per : (k+1)*per]
		}
	}
	return out, nil
}
