package main

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/filter/core"
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/native/envoystate"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

// worker is the core.Worker of one filter configuration on one Envoy
// worker thread, and its core.Host. The core is single-threaded: every
// call into it holds mu, from the worker thread's hooks (uncontended but
// for the moments below), from its timer's goroutine, or from the main
// thread, where the answers of the calls no stream waits on arrive.
type worker struct {
	f     *filter
	index int
	core  *core.Worker

	mu sync.Mutex
	// The fields below are guarded by mu.
	// onThread says that the lock's holder runs on the worker's thread, in
	// a hook: the streams may be read and may make calls.
	onThread bool
	acts     *batch // the acts on streams queued while mu is held (actions.go)
	nextID   uint32 // the last call id given out
	timer    *time.Timer
	stopped  bool
	// Scratch: a call's headers (decoded once per distinct serialization)
	// and an answer's message.
	callRaw  []byte
	callHdrs []dynmod.Header
	body     []byte
	bodyRead []byte // a stream body's bytes the core reads (stream.body)
	answer   rlsproto.Answer
}

var _ core.Host = (*worker)(nil)

// newWorker returns worker index of f, its core not configured yet.
func newWorker(f *filter, index int) *worker {
	w := &worker{f: f, index: index}
	w.core = core.NewWorker(w)
	return w
}

// enter takes the lock for a hook on the worker's thread. The hook defers
// leave.
func (w *worker) enter() {
	w.mu.Lock()
	w.onThread = true
}

// leave releases the lock taken by enter, then does the acts the core
// queued, on this thread.
func (w *worker) leave() {
	w.onThread = false
	b := w.take()
	w.mu.Unlock()
	if b != nil {
		b.run()
		b.reset()
		batches.Put(b)
	}
}

// take returns the acts queued (nil: none) and starts a new batch (mu
// held).
func (w *worker) take() *batch {
	b := w.acts
	if b == nil || len(b.acts) == 0 {
		return nil
	}
	w.acts = nil
	return b
}

// queue returns the batch that acts are queued in (mu held).
func (w *worker) queue() *batch {
	if w.acts == nil {
		w.acts = batches.Get().(*batch)
	}
	return w.acts
}

// fromElsewhere runs fn on the core from a thread that is not the
// worker's (a timer, the main thread): under the lock, the acts it queued
// posted to their streams' worker afterwards.
func (w *worker) fromElsewhere(fn func()) {
	w.mu.Lock()
	var b *batch
	defer func() {
		if r := recover(); r != nil {
			w.Log(core.LevelCritical, "sluice: panic in the native host: "+fmt.Sprint(r))
		}
		b = w.take()
		w.mu.Unlock()
		if b != nil {
			b.post()
			b.reset()
			batches.Put(b)
		}
	}()
	fn()
}

// Now implements core.Host: the process's monotonic clock, which every
// worker reads alike.
func (w *worker) Now() int64 { return int64(time.Since(epoch)) }

// epoch is the origin of Now.
var epoch = time.Now()

// WallNow implements core.Host.
func (w *worker) WallNow() int64 { return time.Now().UnixNano() }

// Log implements core.Host: Envoy's dynamic_modules logger, whose levels
// are the core's.
func (w *worker) Log(level core.Level, msg string) { dynmod.Log(dynmod.LogLevel(level), msg) }

// DefineMetric implements core.Host with the metrics the configuration
// defined when it was made (Envoy takes none later).
func (w *worker) DefineMetric(kind core.MetricKind, name string) (uint32, error) {
	return w.f.metrics.id(kind, name)
}

// IncrementMetric implements core.Host.
func (w *worker) IncrementMetric(id uint32, delta int64) { w.f.metrics.add(id, delta) }

// errGone is the error of a call made once its configuration is dropped.
var errGone = errors.New("the filter configuration is being dropped")

// Call implements core.Host. A call a stream waits on, made on the
// stream's thread, is the stream's callout: Envoy answers it on that
// thread, and cancels it if the stream ends first (the host then tells the
// core, Worker.Cancel). Any other call (a renewal, a settlement, or a
// request's call made from a timer) is the configuration's callout, which
// Envoy takes only on its main thread: it is posted there, and so is its
// answer, which the host then hands to this worker under its lock.
func (w *worker) Call(from core.Stream, c *core.Call) (uint32, error) {
	w.nextID++
	if w.nextID == 0 {
		w.nextID = 1
	}
	id := w.nextID
	if s, ok := from.(*stream); ok && w.onThread && !s.dead && !s.calling {
		if err := s.ds.Callout(c.Cluster, w.headers(c.Headers), c.Frame, timeout(c.TimeoutMs), s.answeredFunc()); err != nil {
			return 0, err
		}
		s.calling, s.callID = true, id
		return id, nil
	}
	hs := append([]dynmod.Header(nil), w.headers(c.Headers)...) // (its strings are copies)
	cluster, body, d := c.Cluster, append([]byte(nil), c.Frame...), timeout(c.TimeoutMs)
	if !w.f.c.Post(func() { w.callFromMain(id, cluster, hs, body, d) }) {
		return 0, errGone
	}
	return id, nil
}

// callFromMain makes call id as the configuration's callout, on the main
// thread; a call Envoy refuses is answered as failed.
func (w *worker) callFromMain(id uint32, cluster string, hs []dynmod.Header, body []byte, d time.Duration) {
	err := w.f.c.Callout(cluster, hs, body, d, func(r *dynmod.Response) {
		w.fromElsewhere(func() { w.deliver(id, r.Result, r, nil) })
	})
	if err != nil {
		w.fromElsewhere(func() {
			w.answer = rlsproto.Answer{Failure: "cannot call the control plane (cluster " + cluster + "): " + err.Error()}
			w.core.Answer(id, &w.answer)
		})
	}
}

// deliver reads an answer to call id, made by stream s (nil: the
// configuration), and hands it to the core (mu held). A panic reading it
// fails the call, as an answer that cannot be read.
func (w *worker) deliver(id uint32, result dynmod.CalloutResult, r response, s *stream) {
	defer func() {
		if p := recover(); p != nil {
			// Logged here, as every hook's panic is: the core's warning of
			// the failure that follows is rate-limited.
			w.Log(core.LevelCritical, "sluice: panic in answer: "+fmt.Sprint(p))
			w.answer = rlsproto.Answer{Failure: "panic reading the control plane's answer: " + fmt.Sprint(p)}
			w.core.Answer(id, &w.answer)
		}
	}()
	testPanic("answer", s)
	w.answer = readAnswer(result, r, &w.body)
	w.core.Answer(id, &w.answer)
	w.answer = rlsproto.Answer{}
}

// headers returns the call headers serialized in raw (package headermap),
// decoded: the same for every call of a configuration, so decoded once.
func (w *worker) headers(raw []byte) []dynmod.Header {
	if string(raw) == string(w.callRaw) && w.callHdrs != nil {
		return w.callHdrs
	}
	w.callRaw = append(w.callRaw[:0], raw...)
	pairs, _ := headermap.Parse(nil, w.callRaw)
	w.callHdrs = w.callHdrs[:0]
	for _, p := range pairs {
		w.callHdrs = append(w.callHdrs, dynmod.Header{Name: string([]byte(p[0])), Value: string([]byte(p[1]))})
	}
	return w.callHdrs
}

// timeout is a call's timeout.
func timeout(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// Schedule implements core.Host with a Go timer: the tick runs on the
// timer's goroutine, under the lock, and posts what it does to streams to
// their worker.
func (w *worker) Schedule(delay int64) {
	if w.stopped {
		return
	}
	d := time.Duration(max(delay, config.Millisecond))
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.tick)
		return
	}
	w.timer.Reset(d)
}

// tick is the timer's function.
func (w *worker) tick() {
	w.fromElsewhere(func() {
		if !w.stopped {
			w.core.Tick()
		}
	})
}

// stop stops the worker: its configuration is being dropped.
func (w *worker) stop() {
	w.fromElsewhere(func() {
		w.stopped = true
		if w.timer != nil {
			w.timer.Stop()
		}
		w.core.Stop()
	})
}

// Blocks implements core.Host: the process's blocks of domain.
func (w *worker) Blocks(domain string) core.Blocks { return w.f.domain(domain).Blocks() }

// Pools implements core.Host: the process's pools of domain, or a table of
// this worker's own.
func (w *worker) Pools(domain string, perWorker bool) lease.Pools {
	if perWorker {
		return envoystate.OwnPools()
	}
	return w.f.domain(domain).Pools()
}

// bytesString returns b as a string without copying.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
