package precheck

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// The property: whatever the algorithm, the precheck never rejects a request
// that the global limiter would have allowed. The test simulates several
// proxy instances (each with its own Table) sharing one global limiter per
// descriptor (the algorithms implementations as the oracle), with
// network delays, lost responses and requests of several costs. Every
// request the precheck rejects is shown to the oracle, without effect, at
// the time it would have reached it; the oracle must deny it.

// oracle is a global limiter for one descriptor.
type oracle interface {
	allow(now, cost int64) (algorithms.Result, error) // decide and update
	peek(now, cost int64) (algorithms.Result, error)  // decide without effect
	reported() Limit                                  // what the control plane reports
	capacity() int64                                  // largest cost that can ever pass
}

// scale runs an algorithm in microseconds, as the Redis Lua port does, when
// us is set: times are divided and durations multiplied by 1000.
type scale struct{ us bool }

func (s scale) in(t int64) int64 {
	if s.us {
		return t / 1000
	}
	return t
}

func (s scale) out(r algorithms.Result, err error) (algorithms.Result, error) {
	if s.us {
		r.RetryAfter *= 1000
		r.ResetAfter *= 1000
		r.Wait *= 1000
	}
	return r, err
}

type fixedOracle struct {
	scale
	l algorithms.FixedWindow
	s algorithms.FixedWindowState
	w int64 // window in ns
}

func (o *fixedOracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.out(o.l.Allow(&o.s, o.in(now), cost))
}
func (o *fixedOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.s
	return o.out(o.l.Allow(&s, o.in(now), cost))
}
func (o *fixedOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindFixedWindow, Limit: o.l.Limit, Window: o.w}
}
func (o *fixedOracle) capacity() int64 { return o.l.Limit }

type slidingWindowOracle struct {
	scale
	l algorithms.SlidingWindow
	s algorithms.SlidingWindowState
	w int64
}

func (o *slidingWindowOracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.out(o.l.Allow(&o.s, o.in(now), cost))
}
func (o *slidingWindowOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.s
	return o.out(o.l.Allow(&s, o.in(now), cost))
}
func (o *slidingWindowOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindSlidingWindow, Limit: o.l.Limit, Window: o.w}
}
func (o *slidingWindowOracle) capacity() int64 { return o.l.Limit }

// slidingLogOracle keeps the admitted requests so that a peek can rebuild
// the log (its state holds a ring that a copy would share).
type slidingLogOracle struct {
	scale
	l        algorithms.SlidingLog
	s        *algorithms.SlidingLogState
	admitted [][2]int64 // (time in the oracle's unit, cost)
	w        int64
}

func (o *slidingLogOracle) allow(now, cost int64) (algorithms.Result, error) {
	r, err := o.l.Allow(o.s, o.in(now), cost)
	if err == nil && r.Allowed {
		o.admitted = append(o.admitted, [2]int64{o.in(now), cost})
	}
	return o.out(r, err)
}
func (o *slidingLogOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.l.NewState()
	for _, a := range o.admitted {
		if a[0] > o.in(now)-o.l.Window {
			if r, err := o.l.Allow(s, a[0], a[1]); err != nil || !r.Allowed {
				panic("replaying the sliding log diverged")
			}
		}
	}
	return o.out(o.l.Allow(s, o.in(now), cost))
}
func (o *slidingLogOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindSlidingLog, Limit: o.l.Limit, Window: o.w}
}
func (o *slidingLogOracle) capacity() int64 { return o.l.Limit }

type tokenBucketOracle struct {
	scale
	l algorithms.TokenBucket
	s algorithms.TokenBucketState
	w int64
}

func (o *tokenBucketOracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.out(o.l.Allow(&o.s, o.in(now), cost))
}
func (o *tokenBucketOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.s
	return o.out(o.l.Allow(&s, o.in(now), cost))
}
func (o *tokenBucketOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindTokenBucket, Limit: o.l.Rate, Window: o.w, Burst: o.l.Burst}
}
func (o *tokenBucketOracle) capacity() int64 { return o.l.Burst }

type gcraOracle struct {
	scale
	l algorithms.GCRA
	s algorithms.GCRAState
	w int64
}

func (o *gcraOracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.out(o.l.Allow(&o.s, o.in(now), cost))
}
func (o *gcraOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.s
	return o.out(o.l.Allow(&s, o.in(now), cost))
}
func (o *gcraOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindGCRA, Limit: o.l.Count, Window: o.w, Burst: o.l.MaxBurst + 1}
}
func (o *gcraOracle) capacity() int64 { return o.l.MaxBurst + 1 }

type reserveOracle struct {
	scale
	l algorithms.Reserve
	s algorithms.ReserveState
	w int64
}

func (o *reserveOracle) allow(now, cost int64) (algorithms.Result, error) {
	return o.out(o.l.Allow(&o.s, o.in(now), cost))
}
func (o *reserveOracle) peek(now, cost int64) (algorithms.Result, error) {
	s := o.s
	return o.out(o.l.Allow(&s, o.in(now), cost))
}
func (o *reserveOracle) reported() Limit {
	return Limit{Algorithm: algorithms.KindReserve, Limit: o.l.Rate, Window: o.w, Burst: o.l.Burst}
}
func (o *reserveOracle) capacity() int64 { return o.l.Burst }

const ms = int64(1e6)

// randomOracle returns a global limiter of the given algorithm with random
// parameters; windows are whole milliseconds, as the metadata reports them.
func randomOracle(rng *rand.Rand, alg algorithms.Kind) oracle {
	sc := scale{us: rng.IntN(2) == 0}
	w := (50 + rng.Int64N(950)) * ms
	if rng.IntN(4) == 0 {
		w = (1 + rng.Int64N(20)) * ms // short windows: many boundaries
	}
	n := 1 + rng.Int64N(30)
	win := sc.in(w)
	switch alg {
	case algorithms.KindFixedWindow:
		return &fixedOracle{scale: sc, l: algorithms.FixedWindow{Limit: n, Window: win, Aligned: rng.IntN(2) == 0}, w: w}
	case algorithms.KindSlidingWindow:
		return &slidingWindowOracle{scale: sc, l: algorithms.SlidingWindow{Limit: n, Window: win}, w: w}
	case algorithms.KindSlidingLog:
		l := algorithms.SlidingLog{Limit: n, Window: win}
		return &slidingLogOracle{scale: sc, l: l, s: l.NewState(), w: w}
	case algorithms.KindTokenBucket:
		return &tokenBucketOracle{scale: sc, l: algorithms.TokenBucket{Rate: n, Period: win, Burst: 1 + rng.Int64N(40)}, w: w}
	case algorithms.KindGCRA:
		return &gcraOracle{scale: sc, l: algorithms.GCRA{MaxBurst: rng.Int64N(20), Count: n, Period: win}, w: w}
	default:
		return &reserveOracle{scale: sc, l: algorithms.Reserve{Rate: n, Period: win, Burst: 1 + rng.Int64N(20), MaxWait: sc.in(rng.Int64N(3) * w / 4)}, w: w}
	}
}

// The simulation's events.
type eventKind uint8

const (
	arrive eventKind = iota // an instance receives a request
	decide                  // the request reaches the global limiter
	answer                  // the answer reaches the instance
	ghost                   // a prechecked request would have reached the global limiter
)

type event struct {
	at   int64
	seq  int // ties keep scheduling order
	kind eventKind
	req  *simRequest
	desc int // ghost: the descriptor that rejected
}

type simRequest struct {
	vm      int
	cost    []int64 // per descriptor
	sentAt  int64
	results []algorithms.Result
	allowed bool
	lost    bool // the answer never arrives (timeout)
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// simulation is one run of several instances against shared global limiters.
type simulation struct {
	t       *testing.T
	rng     *rand.Rand
	delay   int64    // D: the call timeout
	oracles []oracle // one per descriptor
	atomic  bool     // the control plane takes nothing unless all descriptors pass
	buckets bool     // report only limits, never over-limit: the buckets alone decide
	// adversarial adds bursts as large as the limit's capacity, at window
	// boundaries and at random times, which is where the local bounds are
	// tight.
	adversarial bool
	// shared: every denial one instance records is imported at once by
	// all the others (the VMs of one proxy, through its shared data).
	shared bool
	// deferred: half the admitted answers are recorded with
	// RecordAdmitted, their charges made at the table's next call.
	deferred bool
	tables   []*Table
	queue    eventQueue
	seq      int
	rejected int // prechecked rejections
	admitted int // global admissions
	label    string
}

func (s *simulation) schedule(at int64, kind eventKind, req *simRequest, desc int) {
	s.seq++
	heap.Push(&s.queue, &event{at: at, seq: s.seq, kind: kind, req: req, desc: desc})
}

func (s *simulation) key(d int) []byte { return []byte("descriptor-" + strconv.Itoa(d)) }

func (s *simulation) run(end int64) {
	// Arrivals: a load of a random multiple (0.3 to 8) of the first
	// limit's rate, in bursts, mostly from one instance (a lone instance
	// saturating the limit is what the buckets can catch).
	vms := len(s.tables)
	lim := s.oracles[0].reported()
	if s.adversarial {
		s.adversarialArrivals(end, lim)
	}
	load := (0.3 + s.rng.Float64()*7.7) * float64(lim.Limit) * float64(end) / float64(lim.Window)
	requests := min(max(int(load), 50), 4000)
	hot := 0.5 + s.rng.Float64()/2
	for i := 0; i < requests; {
		at := s.rng.Int64N(end)
		burst := 1
		if s.rng.IntN(8) == 0 {
			burst = 2 + s.rng.IntN(8)
		}
		vm := 0
		if s.rng.Float64() > hot {
			vm = s.rng.IntN(vms)
		}
		for b := 0; b < burst; b++ {
			req := &simRequest{vm: vm, cost: make([]int64, len(s.oracles))}
			for d, o := range s.oracles {
				switch req.cost[d] = 1; s.rng.IntN(12) {
				case 0, 1:
					req.cost[d] = 1 + s.rng.Int64N(min(o.capacity(), 4))
				case 2:
					req.cost[d] = 1 + s.rng.Int64N(o.capacity())
				}
			}
			s.schedule(at, arrive, req, 0)
			i++
		}
	}
	for s.queue.Len() > 0 {
		e := heap.Pop(&s.queue).(*event)
		switch e.kind {
		case arrive:
			s.arrive(e.at, e.req)
		case decide:
			s.decide(e.at, e.req)
		case answer:
			s.answer(e.at, e.req)
		case ghost:
			s.ghost(e.at, e.req, e.desc)
		}
	}
}

func (s *simulation) adversarialArrivals(end int64, lim Limit) {
	capacity := s.oracles[0].capacity()
	burst := func(at int64, n int64) {
		for i := int64(0); i < n; i++ {
			req := &simRequest{vm: 0, cost: make([]int64, len(s.oracles))}
			for d := range req.cost {
				req.cost[d] = 1
			}
			s.schedule(at, arrive, req, 0)
		}
	}
	step := lim.Window * max(1, end/lim.Window/100) // at most about 100 boundaries
	for at := lim.Window; at < end; at += step * (1 + s.rng.Int64N(3)) {
		// Just before and just after a window boundary (aligned windows
		// start at multiples of the window in either time unit).
		burst(at-1-s.rng.Int64N(s.delay/2+1), capacity+1)
		burst(at+s.rng.Int64N(s.delay/2+1), capacity+1)
	}
	for i := 0; i < 20; i++ {
		burst(s.rng.Int64N(end), capacity+1+s.rng.Int64N(3))
	}
}

func (s *simulation) arrive(now int64, req *simRequest) {
	table := s.tables[req.vm]
	for d := range s.oracles {
		v := table.Check(s.key(d), req.cost[d], now)
		if v.Reject {
			if v.RetryAfter <= 0 {
				s.t.Fatalf("%s: rejection without a retry-after: %+v", s.label, v)
			}
			s.rejected++
			// It would have reached the global limiter up to D later.
			s.schedule(now+s.forward(), ghost, req, d)
			return
		}
	}
	req.sentAt = now
	s.schedule(now+s.forward(), decide, req, 0)
}

// forward returns how long a request takes to reach the global limiter: up
// to D, often much less.
func (s *simulation) forward() int64 {
	if s.rng.IntN(4) == 0 {
		return s.delay - s.rng.Int64N(s.delay/10+1)
	}
	return s.rng.Int64N(s.delay/2 + 1)
}

func (s *simulation) decide(now int64, req *simRequest) {
	req.results = make([]algorithms.Result, len(s.oracles))
	req.allowed = true
	if s.atomic {
		for d, o := range s.oracles {
			r, err := o.peek(now, req.cost[d])
			if err != nil {
				s.t.Fatalf("%s: oracle: %v", s.label, err)
			}
			req.results[d] = r
			req.allowed = req.allowed && r.Allowed
		}
		if req.allowed {
			for d, o := range s.oracles {
				if r, err := o.allow(now, req.cost[d]); err != nil || !r.Allowed {
					s.t.Fatalf("%s: oracle changed its mind: %v %v", s.label, r, err)
				}
			}
		}
	} else {
		for d, o := range s.oracles {
			r, err := o.allow(now, req.cost[d])
			if err != nil {
				s.t.Fatalf("%s: oracle: %v", s.label, err)
			}
			req.results[d] = r
			req.allowed = req.allowed && r.Allowed
		}
	}
	if req.allowed {
		s.admitted++
	}
	req.lost = s.rng.IntN(20) == 0
	if !req.lost {
		// The answer arrives within D of sending.
		latest := req.sentAt + s.delay
		s.schedule(now+s.rng.Int64N(latest-now+1), answer, req, 0)
	}
}

func (s *simulation) answer(now int64, req *simRequest) {
	table := s.tables[req.vm]
	for d, o := range s.oracles {
		r := req.results[d]
		out := Outcome{
			Cost:       req.cost[d],
			Limit:      o.reported(),
			HasLimit:   true,
			Admitted:   req.allowed,
			OverLimit:  !r.Allowed && !s.buckets,
			RetryAfter: r.RetryAfter,
			SentAt:     req.sentAt,
		}
		if s.deferred && req.allowed && s.rng.IntN(2) == 0 && table.RecordAdmitted(s.key(d), out) {
			continue
		}
		table.Record(s.key(d), out, now)
		if b, ok := BlockOf(out, now); ok && s.shared {
			for _, other := range s.tables {
				if other != table {
					other.Import(s.key(d), b, now)
				}
			}
		}
	}
}

func (s *simulation) ghost(now int64, req *simRequest, d int) {
	r, err := s.oracles[d].peek(now, req.cost[d])
	if errors.Is(err, algorithms.ErrCostTooLarge) {
		return // the global limiter rejects it too
	}
	if err != nil {
		s.t.Fatalf("%s: oracle: %v", s.label, err)
	}
	if r.Allowed {
		s.t.Fatalf("%s: the precheck rejected a request of cost %d for descriptor %d (%+v) at %d that the global limiter allows",
			s.label, req.cost[d], d, s.oracles[d].reported(), now)
	}
}

func TestPrecheckNeverRejectsWhatTheGlobalLimiterAllows(t *testing.T) {
	for _, mode := range []struct {
		name                                   string
		buckets, adversarial, shared, deferred bool
	}{
		{"over-limit and buckets", false, false, false, false},
		{"over-limit shared by the instances, and buckets", false, false, true, false},
		{"buckets alone", true, false, false, false},
		{"buckets alone, adversarial", true, true, false, false},
		{"over-limit shared, and buckets, admissions deferred", false, false, true, true},
		{"buckets alone, adversarial, admissions deferred", true, true, false, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			testNeverRejects(t, mode.buckets, mode.adversarial, mode.shared, mode.deferred)
		})
	}
}

func testNeverRejects(t *testing.T, buckets, adversarial, shared, deferred bool) {
	algs := []algorithms.Kind{algorithms.KindFixedWindow, algorithms.KindSlidingWindow, algorithms.KindSlidingLog, algorithms.KindTokenBucket, algorithms.KindGCRA, algorithms.KindReserve}
	runs := 40
	if testing.Short() {
		runs = 10
	}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			totalRejected := 0
			for seed := 0; seed < runs; seed++ {
				rng := rand.New(rand.NewPCG(uint64(alg), uint64(seed)))
				s := &simulation{
					t:       t,
					rng:     rng,
					delay:   []int64{ms / 10, ms, 5 * ms, 20 * ms, 40 * ms}[rng.IntN(5)],
					atomic:  rng.IntN(2) == 0,
					buckets: buckets,
					label:   alg.String() + " seed " + strconv.Itoa(seed),

					adversarial: adversarial,
					shared:      shared,
					deferred:    deferred,
				}
				if adversarial {
					s.delay = []int64{ms / 100, ms / 10}[rng.IntN(2)]
				}
				s.oracles = []oracle{randomOracle(rng, alg)}
				if rng.IntN(3) == 0 { // a second descriptor with another algorithm
					s.oracles = append(s.oracles, randomOracle(rng, algs[rng.IntN(len(algs))]))
				}
				vms := 1 + rng.IntN(4)
				if shared {
					vms = 2 + rng.IntN(3)
				}
				if buckets {
					vms = 1 // the buckets catch a lone instance saturating the limit
				}
				for v := 0; v < vms; v++ {
					s.tables = append(s.tables, NewTable(16, s.delay))
				}
				s.run(5000 * ms)
				if s.admitted == 0 {
					t.Fatalf("%s: nothing admitted", s.label)
				}
				totalRejected += s.rejected
			}
			// Not vacuous: the precheck does reject. With buckets alone, a
			// reserve limit has no bucket, and a fixed window's bucket must
			// allow 2N at once, which one instance rarely reaches.
			if totalRejected == 0 && !(buckets && (alg == algorithms.KindReserve || alg == algorithms.KindFixedWindow)) {
				t.Fatalf("the precheck never rejected anything in %d runs", runs)
			}
			t.Logf("%d prechecked rejections, none wrong", totalRejected)
		})
	}
}
