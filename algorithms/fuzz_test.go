package algorithms

import (
	"encoding/binary"
	"testing"
)

// fuzzSteps drives x with the (time step, cost) pairs encoded in ops and
// checks the invariants that hold for any parameters: invalid parameters or
// costs are refused with a *LimitError and change nothing; results never
// report negative remaining or durations; a denial always says when to retry.
func fuzzSteps(t *testing.T, x subject, valid error, now int64, ops []byte) {
	for len(ops) >= 3 {
		now += int64(binary.LittleEndian.Uint16(ops))
		cost := int64(int8(ops[2]))
		ops = ops[3:]
		before := x.clone()
		r, err := x.allow(now, cost)
		if valid != nil || cost < 0 || cost > x.capacity() {
			if err == nil {
				t.Fatalf("invalid call (params %v, cost %d) accepted: %+v", valid, cost, r)
			}
			if _, ok := err.(*LimitError); !ok {
				t.Fatalf("error %T is not a *LimitError", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("valid call refused: %v (%+v)", err, before)
		}
		if r.Remaining < 0 || r.Remaining > r.Limit || r.ResetAfter < 0 || r.Wait < 0 {
			t.Fatalf("bad result %+v", r)
		}
		if !r.Allowed && r.RetryAfter <= 0 {
			t.Fatalf("denied without a positive RetryAfter: %+v", r)
		}
	}
}

func FuzzFixedWindow(f *testing.F) {
	f.Add(int64(10), int64(1000), true, int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Add(int64(0), int64(-5), false, int64(-100), []byte{9, 9, 9})
	f.Fuzz(func(t *testing.T, limit, window int64, aligned bool, now int64, ops []byte) {
		now %= 1 << 60
		l := FixedWindow{Limit: limit, Window: window, Aligned: aligned}
		fuzzSteps(t, &fixedSubject{l: l}, l.Validate(), now, ops)
	})
}

func FuzzSlidingLog(f *testing.F) {
	f.Add(int64(5), int64(100), int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Fuzz(func(t *testing.T, limit, window, now int64, ops []byte) {
		now %= 1 << 60
		limit %= 1 << 12 // the ring is allocated up front
		l := SlidingLog{Limit: limit, Window: window}
		fuzzSteps(t, &logSubject{l, l.NewState()}, l.Validate(), now, ops)
	})
}

func FuzzSlidingWindow(f *testing.F) {
	f.Add(int64(5), int64(100), int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Fuzz(func(t *testing.T, limit, window, now int64, ops []byte) {
		now %= 1 << 60
		l := SlidingWindow{Limit: limit, Window: window}
		fuzzSteps(t, &slidingSubject{l: l}, l.Validate(), now, ops)
	})
}

func FuzzTokenBucket(f *testing.F) {
	f.Add(int64(20), int64(1000), int64(30), int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Fuzz(func(t *testing.T, rate, period, burst, now int64, ops []byte) {
		now %= 1 << 60
		l := TokenBucket{Rate: rate, Period: period, Burst: burst}
		fuzzSteps(t, &bucketSubject{l: l}, l.Validate(), now, ops)
	})
}

func FuzzGCRA(f *testing.F) {
	f.Add(int64(4), int64(1), int64(1000), int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Fuzz(func(t *testing.T, maxBurst, count, period, now int64, ops []byte) {
		now %= 1 << 60
		l := GCRA{MaxBurst: maxBurst, Count: count, Period: period}
		fuzzSteps(t, &gcraSubject{l: l}, l.Validate(), now, ops)
	})
}

func FuzzReserve(f *testing.F) {
	f.Add(int64(2), int64(1000), int64(2), int64(1000), int64(0), []byte{1, 0, 1, 0, 0, 3})
	f.Fuzz(func(t *testing.T, rate, period, burst, maxWait, now int64, ops []byte) {
		now %= 1 << 60
		l := Reserve{Rate: rate, Period: period, Burst: burst, MaxWait: maxWait}
		fuzzSteps(t, &reserveSubject{l: l}, l.Validate(), now, ops)
	})
}
