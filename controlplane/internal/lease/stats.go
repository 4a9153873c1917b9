package lease

// Unleased says why a check of a leased limit went to the per-request path.
type Unleased int

// The reasons of Unleased.
const (
	UnleasedUnknown  Unleased = iota // Redis's remaining not known yet
	UnleasedRate                     // no rate observed yet
	UnleasedSmall                    // the size came to 1 (remaining, capacity or rate)
	UnleasedFetching                 // a lease call for the key was under way
	UnleasedFull                     // the key table is full
	numUnleased
)

// String names the reason, as the metrics label it.
func (u Unleased) String() string {
	return [...]string{"unknown_remaining", "no_rate", "small", "fetching", "keys_full"}[u]
}

// Unshared says why Share gave nothing.
type Unshared int

// The reasons of Unshared.
const (
	UnsharedNone  Unshared = iota // no unit left on the key
	UnsharedValid                 // too little validity left
	UnsharedSlow                  // the key too slow to spend a unit before the lease ends
	numUnshared
)

// String names the reason, as the metrics label it.
func (u Unshared) String() string { return [...]string{"no_lease", "validity", "slow"}[u] }

// Stats are counts since the Store was made.
type Stats struct {
	Local       int64 // requests answered from a lease (no Redis call of their own)
	PerRequest  int64 // checks passed to the Redis store
	LeaseCalls  int64 // lease script round trips
	Granted     int64 // units leased
	Shared      int64 // units handed to data planes
	Returned    int64 // units given back
	Expired     int64 // units that expired unspent
	Outstanding int64 // units held now
	Shares      int64 // Share calls that gave units
	Late        int64 // units granted by a lease call answered after its check stopped waiting (kept, not lost)
	// Unleased counts the checks of leased limits that went per request,
	// by reason; Unshared the Share calls that gave nothing, by reason.
	Unleased [numUnleased]int64
	Unshared [numUnshared]int64
}

// Stats returns the counts.
func (s *Store) Stats() Stats {
	st := Stats{Local: s.local.Load(), PerRequest: s.perRequest.Load(), LeaseCalls: s.calls.Load(),
		Granted: s.granted.Load(), Shared: s.shared.Load(), Returned: s.returned.Load(), Expired: s.expired.Load(),
		Shares: s.shares.Load(), Late: s.lateUnits.Load()}
	for i := range st.Unleased {
		st.Unleased[i] = s.unleased[i].Load()
	}
	for i := range st.Unshared {
		st.Unshared[i] = s.unshared[i].Load()
	}
	s.mu.Lock()
	for _, e := range s.held {
		st.Outstanding += e.units
	}
	s.mu.Unlock()
	return st
}
