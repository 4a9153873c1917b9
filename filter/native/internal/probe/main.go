// Command probe is an Envoy dynamic module that exercises each part of the
// dynmod binding sluice's native host relies on, one part per value of the
// request's x-probe header, and reports what it saw in response headers
// (x-probe-*). Its test runs it in real Envoy; so does the measurement of
// what the Go runtime costs inside Envoy.
//
//	go build -buildmode=c-shared -o libprobe.so ./filter/native/internal/probe
//
// The filter configuration is JSON: {"cluster": "<name>"}, the cluster its
// callouts go to (GET /callout).
package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
	"github.com/sluicehq/sluice/filter/native/internal/gostats"
)

func main() {}

func init() {
	dynmod.Register(newConfig)
	dynmod.SetPanicHandler(func(p dynmod.Panic) {
		panics.Add(1)
		dynmod.Logf(dynmod.LogWarn, "probe: recovered panic in %s: %v", p.Hook, p.Value)
	})
}

// panics counts the panics the binding recovered.
var panics atomic.Int64

// config is the probe's filter configuration.
type config struct {
	c        *dynmod.Config
	cluster  string
	requests dynmod.Counter    // probe.requests: every request
	held     dynmod.Gauge      // probe.held: requests held now
	count    atomic.Int64      // the requests of mode "count", from every worker
	hooks    gostats.Histogram // time spent in the request headers hook

	mu    sync.Mutex
	facts facts
}

// facts are what the probe saw outside streams, reported by mode "facts".
type facts struct {
	ConfigNewTID     int    // the thread of on_http_filter_config_new
	ConcurrencyAtNew int    // get_concurrency there
	LogLevel         int    // get_log_level
	Panics           int64  // panics recovered so far
	Workers          []int  // worker indexes seen by mode "count"
	MetricsFrozen    string // the error of a metric defined after the Factory
}

func newConfig(c *dynmod.Config, name string, raw []byte) (dynmod.ConfigHandler, error) {
	var js struct {
		Cluster string `json:"cluster"`
	}
	if err := json.Unmarshal(raw, &js); err != nil {
		return nil, fmt.Errorf("probe: filter_config: %w", err)
	}
	cfg := &config{c: c, cluster: js.Cluster}
	cfg.facts.ConfigNewTID = syscall.Gettid()
	cfg.facts.ConcurrencyAtNew = dynmod.Concurrency()
	cfg.facts.LogLevel = int(dynmod.Level())
	var err error
	if cfg.requests, err = c.DefineCounter("probe.requests"); err != nil {
		return nil, err
	}
	if cfg.held, err = c.DefineGauge("probe.held"); err != nil {
		return nil, err
	}
	return cfg, nil
}

// NewStream makes the handler of a stream; its mode is read from the
// request headers.
func (c *config) NewStream(s *dynmod.Stream) dynmod.StreamHandler {
	h := &stream{s: s, cfg: c}
	h.note("new-tid", syscall.Gettid())
	return h
}

// Destroy is called when Envoy drops the configuration.
func (c *config) Destroy() {}

// worker notes that worker index w served a "count" request.
func (c *config) worker(w int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.facts.Workers {
		if x == w {
			return
		}
	}
	c.facts.Workers = append(c.facts.Workers, w)
}

// snapshot returns the facts as JSON.
func (c *config) snapshot() []byte {
	c.mu.Lock()
	f := c.facts
	f.Workers = append([]int(nil), c.facts.Workers...)
	c.mu.Unlock()
	f.Panics = panics.Load()
	_, err := c.c.DefineCounter("probe.late")
	if err != nil {
		f.MetricsFrozen = err.Error()
	}
	b, _ := json.Marshal(f)
	return b
}

// stream is one request's handler.
type stream struct {
	dynmod.PassThrough
	s     *dynmod.Stream
	cfg   *config
	mode  string
	notes []dynmod.Header // added to the response headers
}

// note records a fact for the response headers.
func (h *stream) note(name string, v any) {
	h.notes = append(h.notes, dynmod.Header{Name: "x-probe-" + name, Value: fmt.Sprint(v)})
}

// RequestHeaders runs the request's mode.
func (h *stream) RequestHeaders(end bool) dynmod.HeadersStatus {
	start := time.Now()
	defer func() { h.cfg.hooks.Add(time.Since(start)) }()
	h.cfg.requests.Add(1)
	h.mode, _ = h.s.Headers(dynmod.RequestHeaders).Get("x-probe")
	h.note("request-tid", syscall.Gettid())
	h.note("worker", h.s.WorkerIndex())
	if st, ok := h.runMode(end); ok {
		return st
	}
	return dynmod.HeadersContinue
}

// ResponseHeaders adds the notes.
func (h *stream) ResponseHeaders(bool) dynmod.HeadersStatus {
	h.note("response-tid", syscall.Gettid())
	for _, n := range h.notes {
		h.s.Headers(dynmod.ResponseHeaders).Add(n.Name, n.Value)
	}
	return dynmod.HeadersContinue
}

// RequestBody buffers the body of mode "body" and reports its size.
func (h *stream) RequestBody(end bool) dynmod.BodyStatus {
	if h.mode != "body" {
		return dynmod.BodyContinue
	}
	if !end {
		return dynmod.BodyStopBuffer
	}
	limit := 1 << 10
	if v, ok := h.s.Headers(dynmod.RequestHeaders).Get("x-limit"); ok {
		limit, _ = strconv.Atoi(v)
	}
	b, whole := h.s.Body(dynmod.BufferedRequestBody).Append(nil, limit)
	h.note("body-read", len(b))
	h.note("body-whole", whole)
	h.note("body-size", h.s.Body(dynmod.BufferedRequestBody).Size())
	return dynmod.BodyContinue
}

// held counts a request held until a callout or a hop resumes it.
func (h *stream) hold() dynmod.HeadersStatus {
	h.cfg.held.Add(1)
	return dynmod.HeadersStopAll
}

// resume continues a held request.
func (h *stream) resume() {
	h.cfg.held.Sub(1)
	h.s.ContinueRequest()
}

// calloutHeaders are the headers of the probe's callouts.
func (h *stream) calloutHeaders() []dynmod.Header {
	return []dynmod.Header{{Name: ":method", Value: "GET"}, {Name: ":path", Value: "/callout"}, {Name: "host", Value: h.cfg.cluster}}
}
