package envoystate

import (
	"math/rand/v2"
	"sync"
	"unsafe"

	"github.com/sluicehq/sluice/filter/core/precheck"
)

// Domain is the state of one rate limit domain that the workers of the
// process share: its blocks and its lease pools.
type Domain struct {
	name   string
	refs   int // the configurations that use it (registry.mu)
	blocks *blockTable
	pools  *poolTable
}

// registry holds the domains in use.
var registry struct {
	mu sync.Mutex
	m  map[string]*Domain
}

// caller names this process to the control plane (lease.Pools.Caller):
// drawn once, so that every worker and every configuration of the process
// give the same number, and a restarted Envoy another.
var caller = newCaller()

// newCaller returns a random number other than 0.
func newCaller() uint64 { return max(rand.Uint64(), 1) }

// Acquire returns the state of domain, made if no configuration of the
// process uses it yet; each Acquire is matched by a Release.
func Acquire(domain string) *Domain {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	d := registry.m[domain]
	if d == nil {
		if registry.m == nil {
			registry.m = map[string]*Domain{}
		}
		d = &Domain{name: domain, blocks: &blockTable{}, pools: &poolTable{caller: caller}}
		registry.m[domain] = d
	}
	d.refs++
	return d
}

// Release is told that a configuration no longer uses d: the last one
// drops its state.
func (d *Domain) Release() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	d.refs--
	if d.refs <= 0 && registry.m[d.name] == d {
		delete(registry.m, d.name)
	}
}

// Blocks returns a worker's view of the domain's blocks.
func (d *Domain) Blocks() *Blocks { return &Blocks{t: d.blocks} }

// Pools returns a worker's view of the domain's lease pools.
func (d *Domain) Pools() *Pools { return &Pools{t: d.pools} }

// OwnPools returns a pool table of one worker's own (shared_state off), as
// if the worker were alone in its proxy: it names itself to the control
// plane with a number of its own.
func OwnPools() *Pools { return &Pools{t: &poolTable{caller: newCaller()}} }

// Domains returns the number of domains in use.
func Domains() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return len(registry.m)
}

// Bound returns the most bytes one domain's state can hold: its two tables
// full, each slot with the longest key (and a block the longest name).
func Bound() int { return BoundFor(MaxKeyLen, precheck.MaxNameLen) }

// BoundFor returns the most bytes one domain's state can hold when its
// keys are at most keyLen bytes and its limits' names nameLen: both tables
// full, with the allocator's rounding (at most 1/8, and 16 bytes per
// allocation) on what is allocated per entry.
func BoundFor(keyLen, nameLen int) int {
	alloc := func(n int) int { return max(n+n/8, 16) }
	entry := alloc(int(unsafe.Sizeof(blockEntry{}))) + alloc(keyLen) + alloc(nameLen)
	blocks := int(unsafe.Sizeof(blockTable{})) + Slots*entry
	pools := int(unsafe.Sizeof(poolTable{})) + Slots*alloc(keyLen)
	return blocks + pools
}
