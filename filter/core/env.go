package core

import (
	"strconv"

	"github.com/sluicehq/sluice/filter/core/config"
)

// logEvery spaces out repeated warnings.
const logEvery = config.Second

// env is what every stage of a worker shares: the host, the
// configuration, the metrics' ids, and the limit on warnings.
type env struct {
	host Host
	cfg  *config.Config
	ids  [numMetrics]uint32
	// defined says which metrics were defined (those defined on first use
	// are defined once).
	defined [numMetrics]bool
	// Warnings are logged at most once per logEvery.
	lastWarn   int64
	suppressed int
}

// count adds one to metric m.
func (e *env) count(m metric) { e.host.IncrementMetric(e.ids[m], 1) }

// add adds delta to metric m.
func (e *env) add(m metric, delta int64) { e.host.IncrementMetric(e.ids[m], delta) }

// define defines the metrics from first to last (included) that are not
// defined yet; a failure is logged (the metric then counts nowhere).
func (e *env) define(first, last metric) {
	for m := first; m <= last; m++ {
		if e.defined[m] {
			continue
		}
		id, err := e.host.DefineMetric(Metrics[m].Kind, Metrics[m].Name)
		if err != nil {
			e.warn("sluice: cannot define metric " + Metrics[m].Name + ": " + err.Error())
		}
		e.ids[m], e.defined[m] = id, true
	}
}

// warn logs a warning, at most one per logEvery; the others are counted
// and reported with the next one.
func (e *env) warn(msg string) {
	now := e.host.Now()
	if now-e.lastWarn < logEvery {
		e.suppressed++
		return
	}
	if e.suppressed > 0 {
		msg += " (" + strconv.Itoa(e.suppressed) + " similar messages suppressed)"
	}
	e.lastWarn, e.suppressed = now, 0
	e.host.Log(LevelWarn, msg)
}

// resume lets x's request go on.
func (e *env) resume(x *Exchange) {
	e.warnErr("cannot resume the request", x.stream.Resume())
}

// recoverHook, deferred, logs a panic in a hook that decides no stream.
func (e *env) recoverHook(hook string) {
	if r := recover(); r != nil {
		e.host.Log(LevelCritical, "sluice: panic in "+hook+": "+panicText(r))
	}
}

// warnErr warns "sluice: what: err" when err is not nil. what must be a
// constant: a string built for the call would cost an allocation every
// time, error or not.
func (e *env) warnErr(what string, err error) {
	if err != nil {
		e.warn("sluice: " + what + ": " + err.Error())
	}
}
