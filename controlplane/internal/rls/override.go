// A descriptor's limit override.

package rls

import (
	"fmt"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// overrideUnits maps the override units to their length. The numeric values
// of typev3.RateLimitUnit equal those of the RLS response enum.
var overrideUnits = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// overridePrefix starts the ID of an override limit. Configured limit IDs
// escape '%' (policy.Limit.ID), so no configured ID starts with "%o".
const overridePrefix = "%override/"

// overrideLimit returns the fixed-window limit a descriptor's limit override
// asks for. As in envoyproxy/ratelimit, the counter is keyed by the window
// (not requests_per_unit), so changing the number keeps the count. The error
// names the field under "limit.".
func overrideLimit(dom *policy.Domain, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*policy.Limit, error) {
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return nil, fmt.Errorf("unit: %v is not a unit (use SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", o.GetUnit())
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, fmt.Errorf("unit_multiplier: must be at least 1")
		}
		mult = m.GetValue()
	}
	if time.Duration(mult) > maxWindow/unit {
		return nil, fmt.Errorf("unit_multiplier: %d %v is too long a window (at most %v)", mult, o.GetUnit(), maxWindow)
	}
	w := unit * time.Duration(mult)
	u := algorithms.Unit(o.GetUnit())
	if mult != 1 {
		u = algorithms.UnitUnknown
	}
	return &policy.Limit{
		Algorithm:   algorithms.KindFixedWindow,
		Requests:    int64(o.GetRequestsPerUnit()),
		Window:      w,
		Unit:        u,
		FailureMode: dom.FailureMode,
		ID:          fmt.Sprintf("%s%v*%d", overridePrefix, o.GetUnit(), mult),
		Domain:      dom.Name,
	}, nil
}
