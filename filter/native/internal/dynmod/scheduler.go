package dynmod

/*
#include "dynmod.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Scheduler runs functions on one Envoy thread: a stream's worker (from
// Stream.Scheduler) or the main thread (Config.Post). Any goroutine may call
// Post. Envoy's scheduler is deleted when its owner goes away (the stream is
// destroyed, the configuration dropped); Post then reports false and the
// functions not yet run are dropped.
type Scheduler struct {
	mu     sync.Mutex
	ptr    unsafe.Pointer // Envoy's scheduler; nil once closed
	config bool           // a configuration's scheduler (main thread), else a stream's
	next   uint64
	funcs  map[uint64]func()
}

// open starts the scheduler on Envoy's scheduler ptr.
func (s *Scheduler) open(ptr unsafe.Pointer, config bool) {
	s.ptr, s.config, s.funcs = ptr, config, map[uint64]func(){}
}

// Post queues fn to run on the scheduler's thread and reports whether it
// was queued. fn runs inside a hook of the scheduler's owner, so it may call
// the owner's methods.
func (s *Scheduler) Post(fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return false
	}
	s.next++
	s.funcs[s.next] = fn
	// Committed under the lock, so that close cannot delete Envoy's
	// scheduler while this goroutine still uses it.
	if s.config {
		C.dm_http_filter_config_scheduler_commit(s.ptr, C.uint64_t(s.next))
	} else {
		C.dm_http_filter_scheduler_commit(s.ptr, C.uint64_t(s.next))
	}
	return true
}

// take removes and returns the function of event, or nil.
func (s *Scheduler) take(event uint64) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn := s.funcs[event]
	delete(s.funcs, event)
	return fn
}

// pending returns how many posted functions have not run yet.
func (s *Scheduler) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.funcs)
}

// close deletes Envoy's scheduler (on its owner's thread) and drops the
// functions not yet run.
func (s *Scheduler) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return
	}
	if s.config {
		C.dm_http_filter_config_scheduler_delete(s.ptr)
	} else {
		C.dm_http_filter_scheduler_delete(s.ptr)
	}
	s.ptr, s.funcs = nil, nil
}
