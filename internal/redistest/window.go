package redistest

import (
	"testing"
	"time"
)

// FarWindow returns a window length, a whole number of hours from 24 to 47,
// whose clock-aligned end (windows aligned on microseconds since the epoch,
// as sluice's scripts align them) is more than 10 minutes after now, Redis's
// time: a test of a few seconds that counts one window's admissions cannot
// see it roll over. Some length always qualifies.
func FarWindow(t testing.TB, now time.Time) time.Duration {
	t.Helper()
	us := now.UnixMicro()
	for h := int64(24); h < 48; h++ {
		w := h * int64(time.Hour/time.Microsecond)
		if w-us%w > int64(10*time.Minute/time.Microsecond) {
			return time.Duration(h) * time.Hour
		}
	}
	t.Fatal("no window of 24 to 47 hours ends more than 10 minutes from now: impossible")
	return 0
}
