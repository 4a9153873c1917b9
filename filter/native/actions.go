package main

import (
	"sync"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/native/internal/dynmod"
)

// The core acts on streams (resume, local reply, headers added) while it
// holds its worker's lock, from a hook of the stream's worker thread, or
// from a timer or a configuration callout's answer on another thread. The
// host does not act there: it queues each act in a batch and does it once
// the lock is released, so that
//   - Envoy, which may call the module back while it resumes or answers a
//     stream (a direct response runs the response hooks at once; a stream
//     that ends is destroyed at once), finds the lock free;
//   - an act from another thread reaches the stream's worker: the batch is
//     posted to the stream's scheduler, and Envoy runs it there, or drops
//     it if the stream ended first.

// actKind is what an act does.
type actKind uint8

const (
	actResume actKind = iota
	actReply
	actRequestHeader
	actResponseHeader
)

// act is one act on a stream. Its bytes are in its batch's buf:
// [from, mid) and [mid, to): a header's name and value, or a reply's body
// and serialized headers.
type act struct {
	s             *stream
	sched         *dynmod.Scheduler // s's, read under the lock: to post the act from another thread
	kind          actKind
	status        uint32
	details       string // a constant of the core's
	from, mid, to int
}

// batch is the acts queued while a worker's lock was held.
type batch struct {
	acts  []act
	buf   []byte
	pairs [][2]string     // scratch: a reply's headers
	hdrs  []dynmod.Header // scratch: the same for dynmod
}

// batches are reused: a batch goes to whoever runs it, and back.
var batches = sync.Pool{New: func() any { return new(batch) }}

func (b *batch) reset() {
	clear(b.acts) // no stale reference keeps a stream alive
	b.acts, b.buf = b.acts[:0], b.buf[:0]
}

// add queues an act with bytes x and y.
func (b *batch) add(s *stream, kind actKind, x, y string) {
	from := len(b.buf)
	b.buf = append(b.buf, x...)
	mid := len(b.buf)
	b.buf = append(b.buf, y...)
	b.acts = append(b.acts, act{s: s, sched: s.sched, kind: kind, from: from, mid: mid, to: len(b.buf)})
}

// run does the acts on the worker thread they belong to, outside any lock:
// an act on a stream that ended meanwhile (Envoy may end one while an
// earlier act runs) is skipped.
func (b *batch) run() {
	for i := range b.acts {
		a := &b.acts[i]
		if a.s.dead {
			continue
		}
		b.do(a)
	}
}

// do does one act.
func (b *batch) do(a *act) {
	ds := a.s.ds
	x, y := bytesString(b.buf[a.from:a.mid]), bytesString(b.buf[a.mid:a.to])
	switch a.kind {
	case actResume:
		ds.ContinueRequest()
	case actRequestHeader:
		ds.Headers(dynmod.RequestHeaders).Add(x, y)
	case actResponseHeader:
		ds.Headers(dynmod.ResponseHeaders).Add(x, y)
	case actReply:
		var err error
		if b.pairs, err = headermap.Parse(b.pairs[:0], b.buf[a.mid:a.to]); err != nil {
			b.pairs = b.pairs[:0]
		}
		b.hdrs = b.hdrs[:0]
		for _, p := range b.pairs {
			b.hdrs = append(b.hdrs, dynmod.Header{Name: p[0], Value: p[1]})
		}
		ds.SendReply(int(a.status), b.hdrs, b.buf[a.from:a.mid], a.details)
	}
}

// post sends the acts, queued off their worker thread, to the schedulers
// of their streams: one posted function per stream, its acts in order.
// A stream without a scheduler (one that never paused, which nothing acts
// on from another thread) or that ended loses its acts.
func (b *batch) post() {
	for i := 0; i < len(b.acts); {
		j := i + 1
		for j < len(b.acts) && b.acts[j].s == b.acts[i].s {
			j++
		}
		if sched := b.acts[i].sched; sched != nil {
			mine := &batch{acts: append([]act(nil), b.acts[i:j]...), buf: b.buf}
			sched.Post(mine.run)
		}
		i = j
	}
	b.buf = nil // the posted batches own it now
}
