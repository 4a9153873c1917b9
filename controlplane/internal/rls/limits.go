// The limits as the store sees them.

package rls

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/store"
)

// storeEntries appends a descriptor's entries, for store.Key, to buf.
func storeEntries(buf []store.Entry, d *ratelimitv3.RateLimitDescriptor) []store.Entry {
	for _, e := range d.GetEntries() {
		buf = append(buf, store.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return buf
}

// storeLimit returns what the store needs to know of l. With months (see
// Options.CalendarMonths), a limit of one month with windows and no
// calendar of its own counts months' calendar months.
func storeLimit(l *policy.Limit, months *calendar.Calendar) store.Limit {
	sl := store.Limit{Algorithm: l.Algorithm, Requests: l.Requests, Window: l.Window, Burst: l.Burst, MaxWait: l.MaxWait,
		Lease: l.Lease, Calendar: l.Calendar}
	if months != nil && sl.Calendar == nil && l.Unit == algorithms.UnitMonth && l.Algorithm.HasWindows() {
		sl.Calendar = months
	}
	return sl
}

// capacity returns the most a limit admits at one instant: the largest
// cost it can ever allow.
func capacity(l store.Limit) int64 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}
