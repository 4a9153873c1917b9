package lease

// Pools is the lease pools of one proxy (one Envoy) for one domain: the
// requests the control plane granted in advance (RLS
// DescriptorStatus.quota), as one pool per descriptor key for every worker
// of the proxy, whichever worker received them. Each worker's core reads
// and writes it; a host implements it on the proxy's per-Envoy state (the
// proxy-wasm host on shared data, with compare-and-swap writes; a native
// host on process memory shared by its workers).
//
// Every unit was debited in the control plane's store before it was
// granted, so spending one admits nothing the global limit refuses; a unit
// lost (a pool another key's overwrites, a write that loses every race)
// can only admit less. Each operation acts on one key's pool at a time and
// is atomic for it; none blocks on another worker. Keys are descriptor keys
// (package descriptors' encoding) the implementation copies if it keeps
// them; times are on the proxy's monotonic clock (core.Host.Now), read
// alike by every worker.
//
// A pool records besides its units a call under way for its key (Ask,
// Renew), so that the workers' requests that find it empty wait for that
// call's grant instead of each calling.
type Pools interface {
	// Caller returns a number that names this proxy to the control plane
	// (rlsproto.QuotaField), alike in every worker and never 0, so that a
	// lease's share is divided among proxies, not workers.
	Caller() uint64
	// Announce records that a worker of the proxy received a lease, so
	// that the others start reading the pools (Announced).
	Announce() error
	// Announced reports whether a worker of the proxy received a lease:
	// until then, a request reads no pool.
	Announced() bool
	// Refresh brings what the worker holds of the proxy's state up to date
	// (on the tick).
	Refresh()

	// Take spends one unit of key's pool valid at now, if there is one.
	// What it read of the pool comes back either way (Took).
	Take(key []byte, now int64) (Took, error)
	// Give puts back n units that Take took from key's pool with expiry
	// until and that were not spent (a request of several descriptors that
	// could not take all of them): only into a live pool of key, or an
	// empty slot; false: they are lost.
	Give(key []byte, n, until, now int64) (bool, error)
	// Grant adds n units valid until until to key's pool: to a live pool
	// of key they add up, ending at the earlier expiry; a live pool of
	// another key (two keys in one slot) is kept, and false says the units
	// are lost; anything else is replaced. A grant ends the call asked
	// (Ask, Renew).
	Grant(key []byte, n, until, now int64) (bool, error)
	// Covers reports whether key's pool holds a unit valid at now,
	// changing nothing.
	Covers(key []byte, now int64) bool
	// Holds reports whether the proxy holds a pool of key, live or ended
	// within Recent, changing nothing.
	Holds(key []byte, now int64) bool

	// Ask is called when a request found key's pool without a unit at now
	// and is about to call the control plane. When another worker's call
	// for key is under way, it reports true: the request may wait for that
	// call's grant instead. Otherwise it records the caller's call as under
	// way until deadline and reports false. Only for a pool of key that
	// Holds; any other reports false and records nothing.
	Ask(key []byte, now, deadline int64) (bool, error)
	// Renew records a renewal of key's pool as the call under way until
	// deadline, as Ask does, and reports true: only for a pool of key that
	// Holds, with fewer than low units valid at now (low 1: none), and no
	// call under way. One renewal per key across the proxy at a time.
	Renew(key []byte, now, deadline, low int64) (bool, error)
	// Asking reports whether a call for key is under way at now.
	Asking(key []byte, now int64) bool
	// Answered ends a call asked for key (Ask, Renew) that brought no
	// grant, so that the requests waiting for it call themselves.
	Answered(key []byte) error

	// Contention returns how many writes lost a race to another worker
	// and were tried again, how many Takes lost every attempt (the request
	// calls), and how many grants and give-backs were lost, since the
	// pools were made: counts a store without races leaves at 0.
	Contention() (retries, exhausted, lost int)
}

// Recent is how long after a pool of a key ends Holds, Ask and Renew still
// count the key as leased (ns).
const Recent = int64(1_000_000_000)

// Took is what Take read of a pool.
type Took struct {
	// OK says that Take spent a unit, valid until Until.
	OK bool
	// Recent says that the pool is the key's, live or ended within Recent:
	// whether Ask of the same key at the same instant could make a request
	// wait, known without another read.
	Recent bool
	// Left and Until are the units left in the key's pool after the take
	// (after its unit, if it took one) and the pool's end, when Recent.
	Left, Until int64
}
