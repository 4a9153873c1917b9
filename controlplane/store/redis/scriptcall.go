// The script calls: how a batch of checks becomes EVALSHA / FCALL commands,
// how they are run (loading the script or the function library when Redis
// lacks it), and how their replies are decoded.

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
)

// ref locates one check: call c's check i.
type ref struct {
	c *call
	i int
}

// scriptCmd is one script call: an EVALSHA (or, after NOSCRIPT, an EVAL) and
// the checks it decides, in KEYS order.
type scriptCmd struct {
	cmd  *redis.IntSliceCmd // the reply is integers only: read without boxing
	args []any
	refs []ref
}

// noRetry makes go-redis leave a script call alone once it may have run: a
// lost reply must not count the request twice.
type noRetry struct{ *redis.IntSliceCmd }

// NoRetry implements redis.Cmder.
func (noRetry) NoRetry() bool { return true }

// build groups the checks of batch into script calls: all together on a
// single server, by hash tag elsewhere; at most maxBatch checks each.
func (s *Store) build(ctx context.Context, batch []*call, now any, functions bool) []*scriptCmd {
	var groups [][]ref
	if s.single {
		var all []ref
		for _, c := range batch {
			for i := range c.wires {
				all = append(all, ref{c, i})
			}
		}
		groups = append(groups, all)
	} else {
		index := map[string]int{}
		for _, c := range batch {
			for i, w := range c.wires {
				tag := hashTag(w.key)
				g, ok := index[tag]
				if !ok {
					g = len(groups)
					index[tag] = g
					groups = append(groups, nil)
				}
				groups[g] = append(groups[g], ref{c, i})
			}
		}
	}
	var cmds []*scriptCmd
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), s.maxBatch)
			cmds = append(cmds, newScriptCmd(ctx, g[:n], now, s.onceTTL, functions))
			g = g[n:]
		}
	}
	return cmds
}

// newScriptCmd returns the FCALL (with functions) or EVALSHA that decides
// refs (see dispatch.lua for the arguments).
func newScriptCmd(ctx context.Context, refs []ref, now any, onceTTL int64, functions bool) *scriptCmd {
	// The distinct limits, numbered from 1 in order of first use; a call
	// rarely holds more than a few, so a linear search beats a map.
	var lims []params
	nums := make([]int, len(refs))
	for k, r := range refs {
		p := r.c.wires[r.i].lim
		n := slices.Index(lims, p)
		if n < 0 {
			n = len(lims)
			lims = append(lims, p)
		}
		nums[k] = n + 1
	}
	keys := len(refs)
	for _, r := range refs {
		if r.c.wires[r.i].once != nil {
			keys++
		}
	}
	n := 6 + keys + len(refs)*argsPerCheck + len(lims)*argsPerLimit
	for _, p := range lims {
		if p.alg >= calendarFlag {
			n += calendarArgs
		}
	}
	args := make([]any, 0, n)
	if functions {
		args = append(args, "fcall", libraryName, keys)
	} else {
		args = append(args, "evalsha", scriptSHA, keys)
	}
	for _, r := range refs {
		w := &r.c.wires[r.i]
		args = append(args, w.key)
		if w.once != nil {
			args = append(args, w.dedupe)
		}
	}
	args = append(args, now, onceTTL, len(lims))
	for _, p := range lims {
		args = append(args, p.alg, p.p1, p.p2, p.p3, p.p4)
		if p.alg >= calendarFlag {
			for _, b := range calendarValues(p.cal) {
				args = append(args, b)
			}
		}
	}
	if uniform(refs, nums) {
		args = append(args, nums[0], refs[0].c.wires[refs[0].i].cost)
	} else {
		for k, r := range refs {
			args = append(args, nums[k], r.c.wires[r.i].cost)
		}
	}
	return &scriptCmd{cmd: newCmd(ctx, args), args: args, refs: refs}
}

// uniform reports whether every check of refs has the same limit (nums) and
// cost: the script then takes that pair once (see dispatch.lua).
func uniform(refs []ref, nums []int) bool {
	cost := refs[0].c.wires[refs[0].i].cost
	for k, r := range refs {
		if nums[k] != nums[0] || r.c.wires[r.i].cost != cost {
			return false
		}
	}
	return true
}

// newCmd returns a command whose first key is its fourth argument, as in
// EVAL and EVALSHA (Cluster routing reads it).
func newCmd(ctx context.Context, args []any) *redis.IntSliceCmd {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// run sends cmds in one round trip (one per node on a Cluster). Errors stay
// on the commands.
func (s *Store) run(ctx context.Context, cmds []*scriptCmd) {
	if len(cmds) == 1 {
		_ = s.client.Process(ctx, noRetry{cmds[0].cmd})
		return
	}
	pipe := s.client.Pipeline()
	for _, sc := range cmds {
		_ = pipe.Process(ctx, noRetry{sc.cmd})
	}
	_, _ = pipe.Exec(ctx)
}

// runScript sends cmds (EVALSHA of a script whose source is src) as run
// does, then sends again, as EVAL of src, those the server answered
// NOSCRIPT (a restarted or failed-over Redis). Errors stay on the commands.
func (s *Store) runScript(ctx context.Context, cmds []*scriptCmd, src string) {
	s.run(ctx, cmds)
	var lost []*scriptCmd
	for _, sc := range cmds {
		if isNoScript(sc.cmd.Err()) {
			sc.args[0], sc.args[1] = "eval", src
			sc.cmd = newCmd(ctx, sc.args)
			lost = append(lost, sc)
		}
	}
	if len(lost) > 0 {
		s.run(ctx, lost)
	}
}

// isNoScript reports whether err says the server does not have the script.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// isNoFunction reports the error FCALL answers for a function the server
// does not have.
func isNoFunction(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR Function not found")
}

// loadLater starts loading the function library unless that is under way,
// not wanted, or failed less than loadRetry ago. Script calls use EVALSHA
// meanwhile.
func (s *Store) loadLater() {
	if s.noFunctions {
		return
	}
	if at := s.failedAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < loadRetry {
		return
	}
	if !s.loading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.loadFunctions(ctx); err != nil {
			s.failedAt.Store(time.Now().UnixNano())
		}
	}()
}

// loadFunctions loads the function library on every master and, when all
// have it, makes script calls FCALLs.
func (s *Store) loadFunctions(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, librarySource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // this version's, loaded by another instance
		}
		return err
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = load(ctx, c)
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	case *redis.Ring:
		err = c.ForEachShard(ctx, load)
	default:
		err = fmt.Errorf("redisstore: cannot load functions through a %T", s.client)
	}
	if err != nil {
		return err
	}
	s.functions.Store(true)
	return nil
}

// decode writes one script call's results into its claimed calls' out
// slices, or their errors. The reply's layout is in dispatch.lua.
func decode(sc *scriptCmd) {
	vals, err := sc.cmd.Result()
	if err == nil {
		err = checkReply(vals, len(sc.refs))
	}
	for k, r := range sc.refs {
		c := r.c
		if !c.claimed || c.err != nil {
			continue
		}
		if err != nil {
			c.err = fmt.Errorf("redisstore: %s: %w", sc.args[0], err)
			continue
		}
		w := &c.wires[r.i]
		v := vals[1+k]
		if v >= 0 {
			c.out[r.i] = algorithms.Result{
				Allowed:    true,
				Limit:      w.limit,
				Remaining:  v,
				ResetAfter: vals[0] * int64(time.Microsecond),
			}
			continue
		}
		long := vals[1+len(sc.refs)+longAnswer*int(-v-1):]
		switch long[0] {
		case 0, 1, 2, 3: // 2 and 3: a charge once that charged nothing (dispatch.lua)
			c.out[r.i] = algorithms.Result{
				Allowed:    long[0]%2 == 1,
				Limit:      w.limit,
				Remaining:  long[1],
				RetryAfter: long[2] * int64(time.Microsecond),
				ResetAfter: long[3] * int64(time.Microsecond),
			}
			if w.once != nil {
				w.once.Duplicate = long[0] >= 2
			}
			if w.lim.alg%modeScale == algReserve { // the third value is an allowed request's wait (reserve.lua)
				res := &c.out[r.i]
				if res.Allowed {
					res.Wait, res.RetryAfter = res.RetryAfter, 0
				} else {
					res.Wait = res.RetryAfter + w.lim.p4*int64(time.Microsecond)
				}
			}
		case badState:
			c.err = fmt.Errorf("redisstore: key %.80q holds a value sluice did not write (wrong type or unparsable state); delete it to reset the limit", w.key)
		case badClock:
			c.err = fmt.Errorf("redisstore: key %.80q: Redis's clock is more than a calendar period away from this replica's", w.key)
		default:
			c.err = fmt.Errorf("redisstore: script answered allowed=%d for key %.80q", long[0], w.key)
		}
	}
}

// checkReply reports a script reply for checks checks that does not have
// dispatch.lua's layout: every long answer pointed at must be there, and
// nothing else.
func checkReply(vals []int64, checks int) error {
	if len(vals) < 1+checks || (len(vals)-1-checks)%longAnswer != 0 {
		return fmt.Errorf("script answered %d integers for %d checks", len(vals), checks)
	}
	longs := (len(vals) - 1 - checks) / longAnswer
	for _, v := range vals[1 : 1+checks] {
		if v < -int64(longs) {
			return fmt.Errorf("script answered a long answer %d of %d", -v, longs)
		}
	}
	return nil
}

// hashTag returns the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}' if that is not empty, else the whole key.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						return key[i+1 : j]
					}
					return key
				}
			}
			return key
		}
	}
	return key
}
