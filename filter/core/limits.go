package core

import (
	"math"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// maxCount bounds the limits and bursts taken from the metadata.
const maxCount = float64(1 << 40)

// ceilCount converts a metadata count, rounding up (a larger limit only
// makes the precheck admit more); ok is false when it is not a usable count.
func ceilCount(f float64) (int64, bool) {
	if !(f >= 0) || f > maxCount {
		return 0, false
	}
	return int64(math.Ceil(f)), true
}

// floorNanos converts milliseconds to nanoseconds, rounding down (a shorter
// window or retry-after only makes the precheck admit more).
func floorNanos(ms float64) (int64, bool) {
	if !(ms >= 0) || ms > float64(math.MaxInt64/2)/1e6 {
		return 0, false
	}
	return int64(math.Floor(ms * 1e6)), true
}

// descriptorLimit returns the limit the control plane reported for
// descriptor i: the sluice metadata when the response has it, otherwise
// current_limit read as a fixed window (see rlsproto's metadata contract).
func descriptorLimit(resp *rlsproto.Response, i int) (precheck.Limit, bool) {
	if resp.HasLimits {
		if i >= len(resp.Limits) {
			return precheck.Limit{}, false
		}
		info := &resp.Limits[i]
		alg, _ := algorithms.ParseKind(info.Algorithm) // the metadata names them as policies do
		limit, ok1 := ceilCount(info.Limit)
		window, ok2 := floorNanos(info.WindowMs)
		burst, ok3 := ceilCount(info.Burst)
		if alg == algorithms.KindUnknown || !ok1 || !ok2 || !ok3 || limit < 1 || window < 1 {
			return precheck.Limit{}, false
		}
		return precheck.Limit{Algorithm: alg, Limit: limit, Window: window, Burst: burst}, true
	}
	if i >= len(resp.Statuses) {
		return precheck.Limit{}, false
	}
	s := &resp.Statuses[i]
	w := s.Window()
	if !s.HasLimit || s.RequestsPerUnit == 0 || w == 0 {
		return precheck.Limit{}, false
	}
	return precheck.Limit{Algorithm: algorithms.KindFixedWindow, Limit: int64(s.RequestsPerUnit), Window: w}, true
}

// descriptorRetryAfter returns, for an over-limit descriptor i, how long
// until the same request would pass (ns), 0 when unknown: retry_after_ms
// from the sluice metadata, or without it duration_until_reset, which for
// the fixed windows of a plain RLS is the same thing.
func descriptorRetryAfter(resp *rlsproto.Response, i int) int64 {
	if resp.HasLimits {
		if i >= len(resp.Limits) {
			return 0
		}
		ns, ok := floorNanos(resp.Limits[i].RetryAfterMs)
		if !ok {
			return 0
		}
		return ns
	}
	if i >= len(resp.Statuses) || !resp.Statuses[i].HasReset {
		return 0
	}
	return max(resp.Statuses[i].DurationUntilReset, 0)
}

// descriptorFailureMode returns the failure mode the control plane reported
// for descriptor i in the sluice metadata, precheck.FailureUnknown when it
// reported none.
func descriptorFailureMode(resp *rlsproto.Response, i int) precheck.FailureMode {
	if !resp.HasLimits || i >= len(resp.Limits) {
		return precheck.FailureUnknown
	}
	switch resp.Limits[i].FailureMode {
	case rlsproto.FailureModeOpen:
		return precheck.FailureOpen
	case rlsproto.FailureModeClosed:
		return precheck.FailureClosed
	}
	return precheck.FailureUnknown
}

// limitName returns what the rate limit headers call descriptor i's limit:
// the name the control plane gives it in the sluice metadata (the limit's
// name, else its ID: the naming rule of the control plane's own headers),
// else current_limit.name; "" when neither says (the caller then names the
// limit after its descriptor keys).
func limitName(resp *rlsproto.Response, i int) string {
	if resp.HasLimits && i < len(resp.Limits) && resp.Limits[i].Name != "" {
		return resp.Limits[i].Name
	}
	if i < len(resp.Statuses) {
		return resp.Statuses[i].Name
	}
	return ""
}
