package policy

import (
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/algorithms"
)

// Bounds on what a policy may ask for. Each keeps the arithmetic of the
// algorithms exact both natively (int64 nanoseconds, see package algorithms)
// and in the Redis Lua scripts (doubles, exact to 2^53, times in
// microseconds).
const (
	// maxRequests is the largest requests_per_unit or burst: RLS reports
	// current_limit.requests_per_unit as a uint32.
	maxRequests = math.MaxUint32
	// maxSpanNs bounds windows and the spans derived from them in
	// nanoseconds, as package algorithms does (2^61 ns is 73 years), so that
	// now plus a few spans cannot overflow int64.
	maxSpanNs = int64(1) << 61
	// maxLua is the largest integer a Lua double holds exactly.
	maxLua = int64(1) << 53
	// maxLuaSpanUs bounds a span added to the current time in Lua: now in
	// microseconds stays below 2^52 until the year 2112, so now plus such a
	// span stays below 2^53.
	maxLuaSpanUs = int64(1) << 52
	// weightScale is the sliding window counter's weight resolution
	// (thousandths): windows and counts are multiplied by it.
	weightScale = 1000
	// MaxSlidingLog is the largest requests_per_unit of a sliding_log limit.
	// The log keeps one entry per admitted request still in the window (a
	// Redis sorted-set member, a slot in the memory store's ring), so a
	// limit's memory and the cost of trimming the log grow with it: 100000
	// entries is a few MB per key in Redis and already far past what an
	// exact per-request log is worth. Larger limits belong to
	// sliding_window, whose memory is constant.
	MaxSlidingLog = 100000
	// maxErrors caps the errors reported for one document.
	maxErrors = 50
)

// limit parses one rate_limit. It returns nil if the limit is invalid.
func (p *parser) limit(raw *yaml.Node, path string) *Limit {
	fs := p.mapping(raw, path, limitFields, descriptorFields, "the descriptor")
	if fs == nil {
		return nil
	}
	ok := true
	l := &Limit{Path: path, replacedBit: -1}
	if f, has := fs["name"]; has {
		if s, good := p.scalar(f, join(path, "name")); !good || !p.checkLen(f, join(path, "name"), s, MaxNameLen) {
			ok = false
		} else {
			l.Name = s
			if first, dup := p.names[s]; dup && s != "" {
				p.errorf(f.val.Line, join(path, "name"),
					"duplicate limit name %q (first at line %d, %s): names must be unique within a domain", s, first.line, first.path)
				ok = false
			} else if s != "" {
				p.names[s] = nameDef{line: f.val.Line, path: path}
			}
		}
	}
	if f, has := fs["replaces"]; has {
		if !p.replaces(f, join(path, "replaces"), l) {
			ok = false
		}
	}
	unlimited := false
	if f, has := fs["unlimited"]; has {
		var good bool
		if unlimited, good = p.boolean(f, join(path, "unlimited")); !good {
			ok = false
		}
	}
	if unlimited {
		for _, name := range []string{"unit", "unit_multiplier", "window", "algorithm", "burst", "max_wait", "calendar"} {
			if f, has := fs[name]; has {
				p.errorf(f.key.Line, join(path, name), "must not be set when unlimited is true")
				ok = false
			}
		}
		if f, has := fs["requests_per_unit"]; has { // ignored, as envoyproxy/ratelimit does
			if _, good := p.integer(f, join(path, "requests_per_unit")); !good {
				ok = false
			}
		}
		l.Unlimited = true
		if !ok || !p.countLimit(raw, path) {
			return nil
		}
		p.limits = append(p.limits, l)
		return l
	}

	l.Algorithm = algorithms.KindFixedWindow
	algoOK := true
	if f, has := fs["algorithm"]; has {
		kinds := algorithms.Kinds()
		names := make([]string, len(kinds))
		for i, k := range kinds {
			names[i] = k.String()
		}
		s, good := p.choice(f, join(path, "algorithm"), "algorithm", names)
		l.Algorithm, _ = algorithms.ParseKind(s)
		algoOK = good
		ok = ok && good
	}

	// The window: exactly one of unit and window.
	unitF, hasUnit := fs["unit"]
	winF, hasWin := fs["window"]
	windowField := join(path, "unit")
	windowOK := false
	switch {
	case hasUnit && hasWin:
		p.errorf(winF.key.Line, join(path, "window"), "unit and window are mutually exclusive: use one")
	case !hasUnit && !hasWin:
		p.errorf(line(raw), path, "needs exactly one of unit (second, minute, hour, day, week, month, year) or window (e.g. 30s, 5m, 1h30m)")
	case hasUnit:
		units := algorithms.Units()
		names := make([]string, len(units))
		for i, u := range units {
			names[i] = u.Name()
		}
		if s, good := p.choice(unitF, windowField, "unit", names); good {
			l.Unit, _ = algorithms.ParseUnit(s)
			l.Window = unitLength(l.Unit)
			windowOK = true
		}
		if f, has := fs["unit_multiplier"]; has && windowOK {
			mpath := join(path, "unit_multiplier")
			m, good := p.integer(f, mpath)
			switch {
			case !good:
				windowOK = false
			case m < 1:
				p.errorf(f.val.Line, mpath, "must be >= 1 (got %d)", m)
				windowOK = false
			case m > maxSpanNs/int64(l.Window):
				p.errorf(f.val.Line, mpath, "too large: unit x unit_multiplier must be at most %s (got %d x %s)",
					time.Duration(maxSpanNs), m, l.Window)
				windowOK = false
			default:
				l.Window *= time.Duration(m)
				l.Unit = unitOf(l.Window)
				windowField = mpath
			}
		}
	case hasWin:
		windowField = join(path, "window")
		if f, has := fs["unit_multiplier"]; has {
			p.errorf(f.key.Line, join(path, "unit_multiplier"), "applies to unit only: with window, write the whole duration")
		} else if w, good := p.window(winF, windowField); good {
			l.Window, l.Unit = w, unitOf(w)
			windowOK = true
		}
	}
	ok = ok && windowOK

	requestsOK := false
	if f, has := fs["requests_per_unit"]; !has {
		p.errorf(line(raw), join(path, "requests_per_unit"), "required (or set unlimited: true)")
	} else if v, good := p.integer(f, join(path, "requests_per_unit")); good {
		switch {
		case v == 0 && algoOK && l.Algorithm != algorithms.KindFixedWindow:
			p.errorf(f.val.Line, join(path, "requests_per_unit"),
				"0 (refuse every request, as envoyproxy/ratelimit reads it) is only accepted with fixed_window (algorithm is %s)", l.Algorithm)
		case v == 0:
			// envoyproxy/ratelimit's "block": every request is refused and
			// nothing is counted.
			requestsOK = true
		case v < 0:
			p.errorf(f.val.Line, join(path, "requests_per_unit"), "must be > 0 (got %d)", v)
		case v > maxRequests:
			p.errorf(f.val.Line, join(path, "requests_per_unit"),
				"must be at most %d (RLS reports it as a uint32; got %d)", int64(maxRequests), v)
		default:
			l.Requests = v
			requestsOK = true
		}
	}
	ok = ok && requestsOK

	burstF, hasBurst := fs["burst"]
	burstOK := true
	if hasBurst {
		burstOK = false
		switch v, good := p.integer(burstF, join(path, "burst")); {
		case !good:
		case algoOK && !l.Algorithm.HasBurst():
			p.errorf(burstF.key.Line, join(path, "burst"),
				"only token_bucket, gcra and reserve take a burst (algorithm is %s)", l.Algorithm)
		case v < 1:
			p.errorf(burstF.val.Line, join(path, "burst"), "must be >= 1 (got %d)", v)
		case v > maxRequests:
			p.errorf(burstF.val.Line, join(path, "burst"), "must be at most %d (got %d)", int64(maxRequests), v)
		default:
			l.Burst = v
			burstOK = true
		}
	} else if l.Algorithm.HasBurst() {
		l.Burst = l.Requests
	}
	ok = ok && burstOK
	ok = p.maxWait(l, fs, line(raw), path, algoOK) && ok
	ok = p.calendar(l, fs, path, algoOK, windowOK) && ok

	if !ok || !algoOK {
		return nil
	}
	burstLine, burstField := line(raw), path
	if hasBurst {
		burstLine, burstField = burstF.val.Line, join(path, "burst")
	}
	winLine := unitF.val
	if hasWin {
		winLine = winF.val
	} else if f, has := fs["unit_multiplier"]; has {
		winLine = f.val
	}
	if !p.checkBounds(l, path, windowField, winLine.Line, burstField, burstLine, fs) || !p.countLimit(raw, path) {
		return nil
	}
	p.limits = append(p.limits, l)
	return l
}

// window parses a window duration: positive, whole microseconds.
func (p *parser) window(f field, path string) (time.Duration, bool) {
	n := resolve(f.val)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!int" || n.Tag == "!!float" {
		p.errorf(f.val.Line, path, "must be a duration with a unit, e.g. 30s, 5m or 1h30m (got %s)", describe(n))
		return 0, false
	}
	w, err := time.ParseDuration(n.Value)
	if err != nil {
		p.errorf(f.val.Line, path, "not a duration: %s (use ns, us, ms, s, m or h, e.g. 30s, 5m, 1h30m, 24h)", quote(n.Value))
		return 0, false
	}
	if w <= 0 {
		p.errorf(f.val.Line, path, "must be > 0 (got %s)", n.Value)
		return 0, false
	}
	if w%time.Microsecond != 0 {
		p.errorf(f.val.Line, path, "must be a whole number of microseconds, the resolution of the Redis clock (got %s)", n.Value)
		return 0, false
	}
	return w, true
}

// checkBounds checks the limits that keep each algorithm's arithmetic exact
// natively (nanoseconds, int64) and in Redis Lua (microseconds, doubles),
// then asks package algorithms to validate the parameters in both forms.
func (p *parser) checkBounds(l *Limit, path, winField string, winLine int, burstField string, burstLine int, fs map[string]field) bool {
	if l.Requests == 0 {
		return true // refuses everything: no algorithm arithmetic to keep exact
	}
	reqField := join(path, "requests_per_unit")
	reqLine := fs["requests_per_unit"].val.Line
	ns := int64(l.Window)
	us := ns / int64(time.Microsecond)
	if ns > maxSpanNs {
		p.errorf(winLine, winField, "must be at most %s (2^61 ns, the algorithms' time span bound; got %s)",
			time.Duration(maxSpanNs), l.Window)
		return false
	}
	switch l.Algorithm {
	case algorithms.KindSlidingWindow:
		// The weighted count multiplies the window and the counts by 1000
		// (a calendar's periods, month at most, are bounded by calendar).
		if l.Calendar == nil && (ns > maxSpanNs/weightScale || us > maxLua/weightScale) {
			p.errorf(winLine, winField,
				"sliding_window: must be at most %s (window x 1000 must stay within 2^61 ns; got %s); use fixed_window or token_bucket for longer windows",
				time.Duration(maxSpanNs/weightScale), l.Window)
			return false
		}
		if l.Requests > maxLua/weightScale {
			p.errorf(reqLine, reqField, "sliding_window: must be at most %d (requests x 1000 must stay within 2^53; got %d)",
				maxLua/weightScale, l.Requests)
			return false
		}
	case algorithms.KindSlidingLog:
		if l.Requests > MaxSlidingLog {
			p.errorf(reqLine, reqField,
				"sliding_log keeps one entry per admitted request: at most %d (got %d); use sliding_window for larger limits",
				MaxSlidingLog, l.Requests)
			return false
		}
	case algorithms.KindTokenBucket, algorithms.KindReserve:
		// The bucket holds burst x window units (1/window of a token
		// each). The native bound (2^61 ns) implies the Lua one (2^53 µs).
		if l.Burst > maxSpanNs/ns || l.Burst > maxLua/us {
			p.errorf(burstLine, burstField,
				"%s: burst x window must be at most %s (2^61 ns) so the bucket arithmetic stays exact (got %d x %s); lower burst or window",
				l.Algorithm, time.Duration(maxSpanNs), l.Burst, l.Window)
			return false
		}
	case algorithms.KindGCRA:
		// The emission interval window/requests must be at least one time
		// unit of the Lua clock (a microsecond). burst x interval is the
		// delay variation tolerance, added to the current time: the native
		// bound (2^61 ns) implies the Lua one (now + it < 2^53 µs).
		if us/l.Requests < 1 {
			p.errorf(reqLine, reqField,
				"gcra: at most one request per microsecond of window (the emission interval window/requests must be >= 1µs; got %d per %s)",
				l.Requests, l.Window)
			return false
		}
		ivNs, ivUs := ns/l.Requests, us/l.Requests
		if l.Burst > maxSpanNs/ivNs || l.Burst > maxLuaSpanUs/ivUs {
			p.errorf(burstLine, burstField,
				"gcra: burst x emission interval (window/requests) must be at most %s (2^61 ns) so the arithmetic stays exact (got %d x %s); lower burst or window",
				time.Duration(maxSpanNs), l.Burst, time.Duration(ivNs))
			return false
		}
	}
	for _, unit := range []time.Duration{time.Nanosecond, time.Microsecond} {
		if err := l.validate(unit); err != nil {
			p.errorf(reqLine, path, "rejected by the %s algorithm (times in %s): %v", l.Algorithm, unit, err)
			return false
		}
	}
	return true
}
