package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/controlplane/store"
)

//go:embed once_mark.lua
var onceMarkLua string

// onceMarkSource is the script MarkOnce runs. Like carry.lua it runs only
// on the way back from an outage: an EVALSHA, not part of the library.
var onceMarkSource = preludeLua + onceMarkLua

// onceMarkSHA is onceMarkSource's SHA-1.
var onceMarkSHA = func() string {
	sum := sha1.Sum([]byte(onceMarkSource))
	return hex.EncodeToString(sum[:])
}()

// MarkOnce remembers marks, store.Once tokens a fallback store applied or
// learnt while Redis could not decide (memory.Store.UnloadOnce), each for
// the time it has left: a settlement retried once Redis decides again is
// then a duplicate here too. A token Redis already remembers for longer is
// left as it is. Script calls of at most MaxBatch tokens, grouped by hash
// slot on a Cluster.
func (s *Store) MarkOnce(ctx context.Context, marks []store.OnceMark) error {
	var now any = ""
	if s.now != nil {
		now = s.now().UnixMicro()
	}
	groups := map[string][]int{}
	var order []string
	for i, m := range marks {
		if m.Key == "" || len(m.Token) == 0 || len(m.Token) > store.MaxOnceToken {
			return fmt.Errorf("redisstore: mark %d: key %.80q, token of %d bytes: not a store.Once", i, m.Key, len(m.Token))
		}
		tag := ""
		if !s.single {
			tag = hashTag(onceKey(m.Key, m.Token))
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
			args := make([]any, 0, 4+2*n)
			args = append(args, "evalsha", onceMarkSHA, n)
			for _, i := range g[:n] {
				args = append(args, onceKey(marks[i].Key, marks[i].Token))
			}
			args = append(args, now)
			for _, i := range g[:n] {
				args = append(args, max(ceilDiv(int64(marks[i].Left), int64(time.Microsecond)), 0))
			}
			cmds = append(cmds, &scriptCmd{cmd: newCmd(ctx, args), args: args})
			g = g[n:]
		}
	}
	s.runScript(ctx, cmds, onceMarkSource)
	for _, sc := range cmds {
		if err := sc.cmd.Err(); err != nil {
			return fmt.Errorf("redisstore: marking settlement tokens: %w", err)
		}
	}
	return nil
}
