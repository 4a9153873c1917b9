package rls

import (
	"sync"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// scratch holds one decision's working slices, reused across requests so
// that a decision allocates little beyond its response.
type scratch struct {
	costs     []int64           // cost per descriptor
	outs      []outcome         // reported outcome per descriptor
	unlimited []bool            // an unlimited limit matched, per descriptor
	matched   [][]*policy.Limit // configured limits per descriptor
	overrides []*policy.Limit   // the request's limit override per descriptor
	pe        []policy.Entry    // one descriptor's entries, for Match
	entries   []store.Entry     // one descriptor's entries, for store.Key
	checks    []store.Check     // the store checks
	slots     []slot            // what each check is for
	results   []algorithms.Result
	keep      bool // false once the store may still write into results
}

// maxPooled bounds the descriptors of a scratch kept for reuse, so that a
// rare huge request does not pin its slices.
const maxPooled = 64

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// getScratch returns a scratch for n descriptors, its per-descriptor slices
// zeroed and of length n.
func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	sc.keep = true
	sc.costs = resize(sc.costs, n)
	sc.outs = resize(sc.outs, n)
	sc.unlimited = resize(sc.unlimited, n)
	sc.matched = resize(sc.matched, n)
	sc.overrides = resize(sc.overrides, n)
	return sc
}

// resize returns s with length n and every element zero.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// resultsFor returns a results slice for n checks.
func (sc *scratch) resultsFor(n int) []algorithms.Result {
	sc.results = resize(sc.results, n)
	return sc.results
}

// abandon marks the results slice as possibly still referenced by the store
// (the caller gave up while the store was deciding): it is not reused.
func (sc *scratch) abandon() { sc.keep = false }

// putScratch returns sc to the pool, dropping its references to policies,
// keys and descriptors.
func putScratch(sc *scratch) {
	if len(sc.costs) > maxPooled || len(sc.checks) > maxPooled {
		return
	}
	clear(sc.outs)
	clear(sc.matched)
	clear(sc.overrides)
	clear(sc.pe)
	clear(sc.entries)
	clear(sc.checks)
	clear(sc.slots)
	sc.pe, sc.entries, sc.checks, sc.slots = sc.pe[:0], sc.entries[:0], sc.checks[:0], sc.slots[:0]
	if !sc.keep {
		sc.results = nil
	}
	scratchPool.Put(sc)
}
