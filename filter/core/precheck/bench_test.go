package precheck

import (
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

// BenchmarkCheck measures a precheck lookup that finds a bucket with room.
func BenchmarkCheck(b *testing.B) {
	tab := NewTable(100, 20*ms)
	key := []byte("\x0eremote_address\x0c198.51.100.4")
	tab.Record(key, Outcome{Cost: 1, Limit: Limit{Algorithm: algorithms.KindTokenBucket, Limit: 10, Window: 1000 * ms, Burst: 10}, HasLimit: true, Admitted: true}, 0)
	for i := 0; i < b.N; i++ {
		tab.Check(key, 1, ms)
	}
}

// BenchmarkRecordNewKey measures what the answer of a call for a key the
// table has not seen costs it once the table is full (bench-envoy's spread
// load): evicting the oldest key, and the new key's entry and local bucket.
func BenchmarkRecordNewKey(b *testing.B) {
	tab, keys, o := fullTable()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o.SentAt = int64(i) * ms
		tab.Record(keys[i%len(keys)], o, o.SentAt+ms)
	}
}

// BenchmarkRecordAdmittedNewKey is BenchmarkRecordNewKey with the answer
// recorded without its time (RecordAdmitted) and its charge made by the
// next request's Check of another key, as in filter.wasm: what an admitted
// callout costs the table, both callbacks together.
func BenchmarkRecordAdmittedNewKey(b *testing.B) {
	tab, keys, o := fullTable()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o.SentAt = int64(i) * ms
		tab.RecordAdmitted(keys[i%len(keys)], o)
		tab.Check(keys[(i+1)%len(keys)], 1, o.SentAt+ms)
	}
}

// BenchmarkRecordNewKeyThenCheck is BenchmarkRecordAdmittedNewKey's
// baseline: the answer recorded with its time, then the next Check.
func BenchmarkRecordNewKeyThenCheck(b *testing.B) {
	tab, keys, o := fullTable()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o.SentAt = int64(i) * ms
		tab.Record(keys[i%len(keys)], o, o.SentAt+ms)
		tab.Check(keys[(i+1)%len(keys)], 1, o.SentAt+ms)
	}
}

// fullTable returns a table of 500 entries, full after recording each of
// keys (twice as many, so that recording them in turn always evicts), and
// the admitted outcome of an hourly limit it recorded them with.
func fullTable() (*Table, [][]byte, Outcome) {
	const n = 500
	tab := NewTable(n, 100*ms)
	keys := make([][]byte, 2*n)
	for i := range keys {
		keys[i] = []byte("\x04user\x05u" + strconv.Itoa(10000+i))
	}
	o := Outcome{Cost: 1, Limit: Limit{Algorithm: algorithms.KindFixedWindow, Limit: 1000, Window: 3600e3 * ms}, HasLimit: true, Admitted: true}
	for i := range keys {
		tab.Record(keys[i], o, ms)
	}
	return tab, keys, o
}
