package precheck

import "testing"

// BenchmarkCheck measures a precheck lookup that finds a bucket with room.
func BenchmarkCheck(b *testing.B) {
	tab := NewTable(100, 20*ms)
	key := []byte("\x0eremote_address\x0c198.51.100.4")
	tab.Record(key, Outcome{Cost: 1, Limit: Limit{Algorithm: TokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10}, HasLimit: true, Admitted: true}, 0)
	for i := 0; i < b.N; i++ {
		tab.Check(key, 1, ms)
	}
}
