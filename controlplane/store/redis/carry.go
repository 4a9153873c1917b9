package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

//go:embed carry.lua
var carryLua string

// carrySource is the script Carry runs: carry.lua with the helpers it uses.
// It runs rarely (once per key after an outage), so it is an EVALSHA, not
// part of the function library.
var carrySource = preludeLua + fixedWindowLua + slidingLogLua + carryLua

// carrySHA is carrySource's SHA-1.
var carrySHA = func() string {
	sum := sha1.Sum([]byte(carrySource))
	return hex.EncodeToString(sum[:])
}()

// argsPerCarry is how many ARGV entries one key of carry.lua takes.
const argsPerCarry = 9 + calendarArgs

// Carry adds to the state in Redis what a replica's memory store admitted
// while Redis could not decide (see store.Carry and carry.lua), in script
// calls of at most MaxBatch keys (grouped by hash slot on a Cluster). It
// returns how many keys it changed. Like decisions, the script calls are
// never retried: a carry that ran twice would count twice. A key whose
// limit the scripts refuse, or which holds a state sluice did not write,
// is skipped and named in the error; the other keys are carried.
func (s *Store) Carry(ctx context.Context, carries []store.Carry) (int, error) {
	var now any = ""
	if s.now != nil {
		now = s.now().UnixMicro()
	}
	groups := map[string][]int{}
	var order []string
	var bad []error
	type item struct {
		key  string
		args [argsPerCarry]int64
	}
	items := make([]item, len(carries))
	clock := s.clock()
	for i, c := range carries {
		w, err := encode(store.Check{Key: c.Key, Limit: c.Limit}, clock)
		if err != nil {
			bad = append(bad, fmt.Errorf("key %.80q: %w", c.Key, err))
			continue
		}
		v, b := carryValues(c), calendarValues(w.lim.cal)
		items[i] = item{key: c.Key, args: [argsPerCarry]int64{w.lim.alg, w.lim.p1, w.lim.p2, w.lim.p3, v[0], v[1], v[2], v[3], v[4],
			b[0], b[1], b[2], b[3], b[4], b[5]}}
		tag := ""
		if !s.single {
			tag = hashTag(c.Key)
		}
		if _, ok := groups[tag]; !ok {
			order = append(order, tag)
		}
		groups[tag] = append(groups[tag], i)
	}
	var cmds []*scriptCmd
	for _, tag := range order {
		g := groups[tag]
		for len(g) > 0 {
			n := min(len(g), s.maxBatch)
			args := make([]any, 0, 4+n*(1+argsPerCarry))
			args = append(args, "evalsha", carrySHA, n)
			for _, i := range g[:n] {
				args = append(args, items[i].key)
			}
			args = append(args, now)
			for _, i := range g[:n] {
				for _, v := range items[i].args {
					args = append(args, v)
				}
			}
			cmds = append(cmds, &scriptCmd{cmd: newCmd(ctx, args), args: args})
			g = g[n:]
		}
	}
	s.runScript(ctx, cmds, carrySource)
	changed := 0
	var failed error
	for _, sc := range cmds {
		vals, err := sc.cmd.Result()
		if err != nil {
			failed = fmt.Errorf("redisstore: carry: %w", err)
			continue
		}
		for k, v := range vals {
			switch v {
			case 1:
				changed++
			case badState:
				bad = append(bad, fmt.Errorf("key %.80q holds a value sluice did not write", sc.args[3+k]))
			case badClock:
				bad = append(bad, fmt.Errorf("key %.80q: Redis's clock is more than a calendar period away from this replica's", sc.args[3+k]))
			}
		}
	}
	if failed == nil && len(bad) > 0 {
		failed = fmt.Errorf("redisstore: carry: %d keys skipped, first: %w", len(bad), bad[0])
	}
	return changed, failed
}

// carryValues converts c's amounts to carry.lua's (microseconds where they
// are times, rounded up where a rounding could lose what was admitted):
// left, base, used, base_prev, used_prev.
func carryValues(c store.Carry) [5]int64 {
	us := func(ns, most int64) int64 { return min(ceilDiv(max(ns, 0), 1000), most) }
	switch c.Limit.Algorithm {
	case algorithms.KindTokenBucket, algorithms.KindGCRA:
		return [5]int64{0, us(c.Base, maxSpan), us(c.Used, maxSpan), 0, 0}
	case algorithms.KindReserve: // start carries max_wait (carry.lua's carry_rs)
		return [5]int64{int64(c.Limit.MaxWait / 1000), us(c.Base, maxSpan), us(c.Used, maxSpan), 0, 0}
	}
	// amounts are counts, capped by the limit (below maxSpan)
	n := func(v int64) int64 { return min(max(v, 0), maxSpan) }
	return [5]int64{us(c.Left, maxSpan), n(c.Base), n(c.Used), n(c.BasePrev), n(c.UsedPrev)}
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return a/b + min(1, a%b) }
