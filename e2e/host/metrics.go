package host

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Metric is a snapshot of one metric a guest defined with proxy_define_metric.
// Metrics are host-wide: every VM that defines the same name and type shares
// one value, as Envoy's stats scope does for its worker VMs.
type Metric struct {
	// Name as the guest defined it.
	Name string
	// Type is counter, gauge or histogram.
	Type MetricType
	// Value is the counter or gauge value; for a histogram, the last recorded
	// value.
	Value int64
	// Count is the number of values a histogram recorded (0 for the others).
	Count uint64
	// Sum is the sum of the values a histogram recorded (0 for the others).
	Sum uint64
	// Min and Max are the smallest and largest values a histogram recorded.
	Min, Max uint64
}

// metric is the shared storage behind a Metric.
type metric struct {
	name  string     // as defined
	typ   MetricType // counter, gauge, histogram
	value int64      // counter/gauge value, histogram last value
	count uint64     // histogram samples
	sum   uint64     // histogram sum
	min   uint64     // histogram minimum
	max   uint64     // histogram maximum
}

// metricKey identifies a metric: Envoy keeps counters, gauges and histograms in
// separate namespaces.
type metricKey struct {
	typ  MetricType // namespace
	name string     // name
}

// metricRegistry holds every metric of a Host.
type metricRegistry struct {
	mu      sync.Mutex            // guards metrics
	metrics map[metricKey]*metric // by type and name
}

// newMetricRegistry returns an empty registry.
func newMetricRegistry() *metricRegistry {
	return &metricRegistry{metrics: make(map[metricKey]*metric)}
}

// define returns the metric of that type and name, creating it at zero.
func (r *metricRegistry) define(typ MetricType, name string) *metric {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := metricKey{typ, name}
	m, ok := r.metrics[k]
	if !ok {
		m = &metric{name: name, typ: typ}
		r.metrics[k] = m
	}
	return m
}

// increment adds delta following Envoy's rules: a counter only goes up
// (delta <= 0 is BAD_ARGUMENT), a gauge goes either way, a histogram cannot be
// incremented.
func (r *metricRegistry) increment(m *metric, delta int64) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.typ {
	case MetricCounter:
		if delta <= 0 {
			return StatusBadArgument
		}
		m.value += delta
	case MetricGauge:
		m.value += delta
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// record sets a gauge, adds to a counter (Envoy's recordMetric on a counter
// adds) and records a histogram sample.
func (r *metricRegistry) record(m *metric, v uint64) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.typ {
	case MetricCounter:
		m.value += int64(v)
	case MetricGauge:
		m.value = int64(v)
	case MetricHistogram:
		if m.count == 0 || v < m.min {
			m.min = v
		}
		if v > m.max {
			m.max = v
		}
		m.count++
		m.sum += v
		m.value = int64(v)
	}
	return StatusOK
}

// get reads a counter or gauge; a histogram is BAD_ARGUMENT as in Envoy.
func (r *metricRegistry) get(m *metric) (uint64, Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.typ == MetricHistogram {
		return 0, StatusBadArgument
	}
	return uint64(m.value), StatusOK
}

// snapshot copies every metric, sorted by name then type.
func (r *metricRegistry) snapshot() []Metric {
	r.mu.Lock()
	out := make([]Metric, 0, len(r.metrics))
	for _, m := range r.metrics {
		out = append(out, Metric{Name: m.name, Type: m.typ, Value: m.value, Count: m.count, Sum: m.sum, Min: m.min, Max: m.max})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Type < out[j].Type
	})
	return out
}

// metricIDs maps one VM's metric ids to the shared metrics. Ids follow
// proxy-wasm-cpp-host: the low two bits are the type, the rest a per-VM
// sequence starting at 1, so the first counter is 4, the first gauge 5 and the
// first histogram 6.
type metricIDs struct {
	next [3]uint32          // last id handed out per type
	ids  map[uint32]*metric // id -> metric
}

// metricTypeMask selects the type bits of a metric id.
const metricTypeMask = 0x3

// define allocates an id for m.
func (ids *metricIDs) define(m *metric) uint32 {
	if ids.ids == nil {
		ids.ids = make(map[uint32]*metric)
		for t := range ids.next {
			ids.next[t] = uint32(t)
		}
	}
	ids.next[m.typ] += 4
	id := ids.next[m.typ]
	ids.ids[id] = m
	return id
}

// lookup finds the metric for id, checking that its type bits match.
func (ids *metricIDs) lookup(id uint32) (*metric, bool) {
	m, ok := ids.ids[id]
	if !ok || MetricType(id&metricTypeMask) != m.typ {
		return nil, false
	}
	return m, true
}

// writePrometheus writes the metrics in the Prometheus text exposition format.
// Names are sanitized to [a-zA-Z0-9_:]; histograms are written as summaries
// with _count and _sum.
func writePrometheus(w io.Writer, ms []Metric) error {
	for _, m := range ms {
		name := promName(m.Name)
		var err error
		switch m.Type {
		case MetricCounter:
			_, err = fmt.Fprintf(w, "# TYPE %s counter\n%s %d\n", name, name, m.Value)
		case MetricGauge:
			_, err = fmt.Fprintf(w, "# TYPE %s gauge\n%s %d\n", name, name, m.Value)
		case MetricHistogram:
			_, err = fmt.Fprintf(w, "# TYPE %s summary\n%s_count %d\n%s_sum %d\n", name, name, m.Count, name, m.Sum)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// promName maps a metric name to a valid Prometheus metric name.
func promName(s string) string {
	var b strings.Builder
	for i, r := range s {
		ok := r == '_' || r == ':' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (i > 0 && r >= '0' && r <= '9')
		if ok {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// metricsHandler serves the registry as Prometheus text.
type metricsHandler struct{ r *metricRegistry }

// ServeHTTP writes the current metrics.
func (h metricsHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = writePrometheus(w, h.r.snapshot())
}
