package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
)

// The script's parts. Each algorithm file defines one local function, a
// line-by-line port of its counterpart in package algorithms on microseconds;
// dispatch.lua decides every key of one call with them.
var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed sliding_window.lua
	slidingWindowLua string
	//go:embed sliding_log.lua
	slidingLogLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
	//go:embed gcra.lua
	gcraLua string
	//go:embed reserve.lua
	reserveLua string
	//go:embed dispatch.lua
	dispatchLua string
)

// scriptSource is the one script every call runs: the parts joined in the
// order their definitions need.
var scriptSource = preludeLua + fixedWindowLua + slidingWindowLua + slidingLogLua +
	tokenBucketLua + gcraLua + reserveLua + dispatchLua

// scriptSHA is scriptSource's SHA-1, the name EVALSHA calls it by.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(scriptSource))
	return hex.EncodeToString(sum[:])
}()

// libraryName names both the Redis 7 function library made of the same parts
// and its one function. It carries the script's hash: a library's name and
// its functions' names are global on a server, so versions of sluice that
// run side by side during an upgrade each find their own.
var libraryName = "sluice_" + scriptSHA[:16]

// librarySource is the function library: the algorithms as in scriptSource,
// and dispatch.lua as the body of the function libraryName.
var librarySource = "#!lua name=" + libraryName + "\n" +
	preludeLua + fixedWindowLua + slidingWindowLua + slidingLogLua + tokenBucketLua + gcraLua + reserveLua +
	"redis.register_function('" + libraryName + "', function(KEYS, ARGV)\n" + dispatchLua + "end)\n"

// The algorithm numbers dispatch.lua knows.
const (
	algFixedWindow   = 1
	algSlidingWindow = 2
	algSlidingLog    = 3
	algTokenBucket   = 4
	algGCRA          = 5
	algReserve       = 6
)

// modeScale encodes a check's mode in its limit's algorithm number:
// algorithm + modeScale*mode (dispatch.lua splits them), so that a call's
// distinct limits stay distinct per mode and each check still sends two
// arguments; calendarFlag is added for a calendar limit, whose parameters
// are followed by its periods' boundaries.
const (
	modeScale    = 10
	calendarFlag = 100
)

// The modes dispatch.lua knows (see the algorithm files).
const (
	luaCharge = 2
	luaOnce   = 1 // added to a charge or a refund applied once
	luaRefund = 4
)

// calendarArgs is how many boundaries a calendar limit sends.
const calendarArgs = 6

// calendarValues returns a calendar limit's boundaries in microseconds, as
// the scripts take them: zeros for none.
func calendarValues(cal *[calendarArgs]int64) (us [calendarArgs]int64) {
	if cal != nil {
		for i, b := range cal {
			us[i] = b / int64(time.Microsecond)
		}
	}
	return us
}

// argsPerLimit is how many ARGV entries one distinct limit takes: algorithm
// and four parameters; argsPerCheck, how many one check takes: its limit's
// number and cost.
const (
	argsPerLimit = 5
	argsPerCheck = 2
)

// longAnswer is how many integers a long answer in the script's reply holds
// (see dispatch.lua): allowed, remaining, retry-after, reset-after.
const longAnswer = 4

// badState is the allowed value the script answers for a key that holds
// something sluice did not write (dispatch.lua's BAD); badClock, for a
// calendar limit whose periods do not reach Redis's clock (CLOCK).
const (
	badState = -1
	badClock = -2
)

// Bounds that keep every intermediate value of the scripts below 2^53, where
// Lua's doubles hold integers exactly. Times are microseconds: the clock stays
// below maxNow (2^52 us is the year 2112), spans and capacities below
// maxSpan (2^50 us is 35 years), so now plus two spans stays below 2^53.
const (
	maxNow  = int64(1) << 52
	maxSpan = int64(1) << 50
)

// The limits the algorithms accept but the scripts cannot compute exactly.
var (
	errLuaWindow = &algorithms.LimitError{Field: "window",
		Problem: "is too long for the Redis store: its Lua arithmetic is exact only below 2^53 microseconds"}
	errLuaLimit = &algorithms.LimitError{Field: "requests",
		Problem: "is too large for the Redis store: its Lua arithmetic is exact only below 2^53"}
	errLuaBurst = &algorithms.LimitError{Field: "burst",
		Problem: "times the window is too large for the Redis store: its Lua arithmetic is exact only below 2^53"}
	errMicros = &algorithms.LimitError{Field: "window",
		Problem: "is not a whole number of microseconds (the Redis store's clock unit)"}
	errLuaMaxWait = &algorithms.LimitError{Field: "max_wait",
		Problem: "is too long for the Redis store: its Lua arithmetic is exact only below 2^53 microseconds"}
	errMaxWaitMicros = &algorithms.LimitError{Field: "max_wait",
		Problem: "is not a whole number of microseconds (the Redis store's clock unit)"}
	errLuaCalendar = &algorithms.LimitError{Field: "calendar",
		Problem: "periods are too long for sliding_window in the Redis store: its Lua arithmetic is exact only below 2^53"}
	errBurst     = &algorithms.LimitError{Field: "burst", Problem: "must not be negative (0 means requests)"}
	errKey       = &algorithms.LimitError{Field: "key", Problem: "is empty"}
	errAlg       = &algorithms.LimitError{Field: "algorithm", Problem: "is unknown"}
	errMode      = &algorithms.LimitError{Field: "mode", Problem: "is unknown"}
	errProbeCost = &algorithms.LimitError{Field: "cost", Problem: "must be 0 for a probe"}
)

// wire is one check as the script receives it.
type wire struct {
	key    string
	lim    params
	cost   int64
	limit  int64       // the capacity, reported as Result.Limit
	once   *store.Once // a charge once: told whether it was a duplicate
	dedupe string      // its dedupe key, in key's hash slot (onceKey)
}

// params is a limit as the script receives it.
type params struct {
	alg            int64                // dispatch.lua's algorithm number
	p1, p2, p3, p4 int64                // the algorithm's parameters, times in microseconds
	cal            *[calendarArgs]int64 // a calendar limit's period boundaries (Unix ns, shared), else nil
}

// encode validates c and converts it to the script's arguments:
//
//	fixed_window, sliding_window, sliding_log: limit, window, 0, 0
//	token_bucket: rate, period, burst, 0
//	gcra: max_burst, count, period, 0
//	reserve: rate, period, burst, max_wait
//
// and, for a calendar limit, the starts of six periods in a row around now
// (Unix nanoseconds, the caller's clock: the script finds the periods
// around Redis's). It applies the algorithms' own validation (on
// microseconds, as the script computes) and the bounds the Lua arithmetic
// needs.
func encode(c store.Check, now int64) (wire, error) {
	if c.Key == "" {
		return wire{}, errKey
	}
	l := c.Limit
	if l.Window%time.Microsecond != 0 {
		return wire{}, errMicros
	}
	w := int64(l.Window / time.Microsecond)
	if l.Burst < 0 {
		return wire{}, errBurst
	}
	burst := l.Burst
	if burst == 0 {
		burst = l.Requests
	}
	x := wire{key: c.Key, cost: c.Cost}
	var err error
	switch l.Algorithm {
	case algorithms.KindFixedWindow:
		err = algorithms.FixedWindow{Limit: l.Requests, Window: w, Aligned: true}.Validate()
		x.lim, x.limit = params{alg: algFixedWindow, p1: l.Requests, p2: w, p3: 0, p4: 0}, l.Requests
	case algorithms.KindSlidingLog:
		err = algorithms.SlidingLog{Limit: l.Requests, Window: w}.Validate()
		x.lim, x.limit = params{alg: algSlidingLog, p1: l.Requests, p2: w, p3: 0, p4: 0}, l.Requests
	case algorithms.KindSlidingWindow:
		err = algorithms.SlidingWindow{Limit: l.Requests, Window: w}.Validate()
		x.lim, x.limit = params{alg: algSlidingWindow, p1: l.Requests, p2: w, p3: 0, p4: 0}, l.Requests
	case algorithms.KindTokenBucket:
		err = algorithms.TokenBucket{Rate: l.Requests, Period: w, Burst: burst}.Validate()
		x.lim, x.limit = params{alg: algTokenBucket, p1: l.Requests, p2: w, p3: burst, p4: 0}, burst
	case algorithms.KindGCRA:
		err = algorithms.GCRA{MaxBurst: burst - 1, Count: l.Requests, Period: w}.Validate()
		x.lim, x.limit = params{alg: algGCRA, p1: burst - 1, p2: l.Requests, p3: w, p4: 0}, burst
	case algorithms.KindReserve:
		if l.MaxWait%time.Microsecond != 0 {
			return wire{}, errMaxWaitMicros
		}
		mw := int64(l.MaxWait / time.Microsecond)
		err = algorithms.Reserve{Rate: l.Requests, Period: w, Burst: burst, MaxWait: mw}.Validate()
		if err == nil && mw > maxSpan {
			err = errLuaMaxWait
		}
		x.lim, x.limit = params{alg: algReserve, p1: l.Requests, p2: w, p3: burst, p4: mw}, burst
	default:
		return wire{}, errAlg
	}
	if err != nil {
		return wire{}, err
	}
	if err := luaBounds(l.Algorithm, l.Requests, w, burst); err != nil {
		return wire{}, err
	}
	if err := store.ValidCalendar(&l); err != nil {
		return wire{}, &algorithms.LimitError{Field: "calendar", Problem: err.Error()}
	}
	if l.Calendar != nil {
		if l.Algorithm == algorithms.KindSlidingWindow && int64(l.Calendar.Longest()/time.Microsecond) > 4*maxSpan/1000 {
			return wire{}, errLuaCalendar
		}
		x.lim.cal = l.Calendar.Boundaries(now)
		x.lim.alg += calendarFlag
	}
	mode := int64(c.Mode)
	switch {
	case c.Cost < 0:
		return wire{}, algorithms.ErrCostNegative
	case c.Mode > store.Refund:
		return wire{}, errMode
	case c.Mode == store.Probe && c.Cost != 0:
		return wire{}, errProbeCost
	case store.ValidOnce(&c) != nil:
		return wire{}, &algorithms.LimitError{Field: "once", Problem: store.ValidOnce(&c).Error()}
	case c.Mode == store.Charge || c.Mode == store.Refund:
		// The algorithms clamp a charge or a refund at twice the capacity
		// (the debt ceiling); clamping here keeps the script's numbers
		// small.
		x.cost = min(c.Cost, 2*x.limit)
		if c.Mode == store.Refund {
			mode = luaRefund
		}
	case c.Cost > x.limit:
		return wire{}, algorithms.ErrCostTooLarge
	}
	if c.Once != nil {
		mode += luaOnce
		x.once, x.dedupe = c.Once, onceKey(c.Key, c.Once.Token)
	}
	x.lim.alg += modeScale * mode
	return x, nil
}

// luaBounds reports limits (already valid for the algorithms) whose
// arithmetic could leave the range where the scripts compute exactly.
// requests, window (microseconds) and burst are positive here.
func luaBounds(alg algorithms.Kind, requests, window, burst int64) error {
	switch alg {
	case algorithms.KindFixedWindow, algorithms.KindSlidingLog:
		// now + window; count + cost <= 2*limit.
		if window > maxSpan {
			return errLuaWindow
		}
		if requests > maxSpan {
			return errLuaLimit
		}
	case algorithms.KindSlidingWindow:
		// (window-e)*1000 and (q+1)*window with q < 1000; the counts
		// times 1000.
		if window > 4*maxSpan/1000 {
			return errLuaWindow
		}
		if requests > maxSpan/1000 {
			return errLuaLimit
		}
	case algorithms.KindTokenBucket, algorithms.KindReserve:
		// used + need <= 2*burst*period; elapsed*rate <= used. reserve:
		// next <= now + max_wait + burst*period/rate, the same products.
		if window > maxSpan {
			return errLuaWindow
		}
		if requests > maxSpan {
			return errLuaLimit
		}
		if burst > maxSpan/window {
			return errLuaBurst
		}
	case algorithms.KindGCRA:
		// tat + interval*cost <= now + 2*interval*(max_burst+1).
		if window > maxSpan {
			return errLuaWindow
		}
		if burst > maxSpan/(window/requests) {
			return errLuaBurst
		}
	}
	return nil
}
