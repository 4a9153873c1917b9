package plugin

import "github.com/sluicehq/sluice/filter/core/config"

// VM receives the proxy-wasm callbacks of one Wasm VM: it keeps the plugin
// instances (root contexts, one per filter configuration sharing the VM)
// and their streams. It implements abi.Handler.
//
// Every callback recovers from panics: a panic in a stream's callback is
// logged and handled as the plugin's failure mode.
type VM struct {
	host    Host
	roots   []*Plugin    // the plugin instances; a VM has one or a few
	streams streamTable  // the streams, by context id
	free    []*stream    // streams kept for reuse: their buffers have grown
	current *stream      // the stream a callback is working on, for recovery
	tokens  *tokenSource // the settlement batch tokens of this VM
}

// NewVM returns a VM that talks to the proxy through host.
func NewVM(host Host) *VM {
	return &VM{host: host, tokens: newTokenSource()}
}

// root returns the plugin instance of root context id, or nil.
func (vm *VM) root(id uint32) *Plugin {
	for _, p := range vm.roots {
		if p.id == id {
			return p
		}
	}
	return nil
}

// OnVMStart accepts the VM; the VM configuration is not used.
func (vm *VM) OnVMStart(rootID uint32, configSize int) bool { return true }

// OnContextCreate creates a plugin instance (parent 0) or a stream.
func (vm *VM) OnContextCreate(id, parent uint32) {
	defer vm.recoverRoot("proxy_on_context_create")
	if parent == 0 {
		vm.removeRoot(id)
		vm.roots = append(vm.roots, newPlugin(id, vm.host, vm.tokens))
		return
	}
	p := vm.root(parent)
	if p == nil {
		return
	}
	var s *stream
	if n := len(vm.free); n > 0 {
		s = vm.free[n-1]
		vm.free = vm.free[:n-1]
	} else {
		s = &stream{}
	}
	s.reset(id, p)
	vm.streams.put(id, s)
}

// OnConfigure configures a plugin instance; false refuses the
// configuration (the proxy then rejects the filter).
func (vm *VM) OnConfigure(rootID uint32, configSize int) (ok bool) {
	defer vm.recoverRoot("proxy_on_configure")
	p := vm.root(rootID)
	if p == nil {
		p = newPlugin(rootID, vm.host, vm.tokens)
		vm.roots = append(vm.roots, p)
	}
	return p.configure(configSize)
}

// OnRequestHeaders decides a request: RequestHeaders, with a panic
// recovered and handled by RecoverRequestHeaders.
func (vm *VM) OnRequestHeaders(id uint32, numHeaders int, endOfStream bool) (action uint32) {
	defer func() {
		if r := recover(); r != nil {
			action = vm.RecoverRequestHeaders(r)
		}
	}()
	return vm.RequestHeaders(id, numHeaders, endOfStream)
}

// RequestHeaders is OnRequestHeaders without the recover, for a caller that
// recovers itself (the abi callback, whose guard would otherwise make it
// two) and then calls RecoverRequestHeaders.
func (vm *VM) RequestHeaders(id uint32, numHeaders int, endOfStream bool) uint32 {
	vm.current = nil
	s := vm.streams.get(id)
	if s == nil {
		return ActionContinue
	}
	vm.current = s
	action := s.plugin.onRequestHeaders(s)
	vm.current = nil
	return action
}

// RecoverRequestHeaders handles a panic r recovered from RequestHeaders as
// the failure mode of the stream it was deciding, and returns the
// callback's action.
func (vm *VM) RecoverRequestHeaders(r any) uint32 {
	action := ActionContinue
	vm.handlePanic(r, "proxy_on_request_headers", &action, false)
	return action
}

// OnResponseHeaders adds the rate limit headers to an admitted request's
// response.
func (vm *VM) OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) (action uint32) {
	s := vm.streams.get(id)
	if s == nil || (len(s.response.spans) == 0 && !s.usage.armed) {
		return ActionContinue // nothing to add (a local reply, most often): no deferred recover either
	}
	defer vm.recoverRoot("proxy_on_response_headers")
	if s.usage.armed {
		s.plugin.captureHeaders(s, endOfStream)
	}
	s.plugin.onResponseHeaders(s)
	return ActionContinue
}

// OnResponseBody counts the response body of a stream with usage-based
// limits.
func (vm *VM) OnResponseBody(id uint32, bodySize int, endOfStream bool) uint32 {
	if s := vm.streams.get(id); s != nil && s.usage.armed {
		s.plugin.captureBody(s, bodySize, endOfStream)
	}
	return ActionContinue
}

// OnResponseTrailers reads the cost values of a stream with usage-based
// limits from its response trailers.
func (vm *VM) OnResponseTrailers(id uint32, numTrailers int) uint32 {
	s := vm.streams.get(id)
	if s == nil || !s.usage.armed {
		return ActionContinue
	}
	defer vm.recoverRoot("proxy_on_response_trailers")
	s.plugin.captureTrailers(s)
	return ActionContinue
}

// OnHTTPCallResponse takes the control plane's answer to a call.
func (vm *VM) OnHTTPCallResponse(rootID, callID uint32, numHeaders, bodySize, numTrailers int) {
	p := vm.root(rootID)
	if p == nil {
		return
	}
	if p.settle.owns(callID) {
		defer vm.recoverRoot("proxy_on_http_call_response (settlement)")
		p.settle.onAnswer(p, callID, numHeaders, bodySize)
		return
	}
	if p.renew.owns(callID) {
		defer vm.recoverRoot("proxy_on_http_call_response (lease renewal)")
		reason, _ := p.readAnswer(numHeaders, bodySize)
		p.onRenewal(callID, reason)
		return
	}
	s := p.answered(callID)
	if s == nil {
		return
	}
	vm.current = s
	var action uint32
	defer vm.recoverStream("proxy_on_http_call_response", &action, true)
	p.onAnswer(s, numHeaders, bodySize)
	vm.current = nil
	p.called(s)
	vm.release(s)
}

// answered returns the stream of a call being answered, and forgets the
// call; nil when the call is not (or no longer) one of ours.
func (p *Plugin) answered(callID uint32) *stream {
	s, ok := p.calls[callID]
	if !ok || s.callID != callID {
		return nil // an answer after the tick gave up on the call, or not ours
	}
	delete(p.calls, callID)
	return s
}

// OnTick gives up on calls the proxy never answered and resumes the held
// requests whose wait is over.
func (vm *VM) OnTick(rootID uint32) {
	defer vm.recoverRoot("proxy_on_tick")
	p := vm.root(rootID)
	if p == nil {
		return
	}
	now := vm.host.Now()
	p.nextTick = now + int64(p.tickMs)*config.Millisecond
	p.settle.tick(p, now)
	for _, s := range p.overdue(now) {
		vm.current = s
		p.giveUp(s)
		vm.current = nil
		p.called(s)
		vm.release(s)
	}
	p.renewTick(now)
	p.wakeStale(now)
	p.releaseDue(now)
	if p.shared != nil {
		p.shared.RefreshSeed()
	}
	if q := &p.quotas; q.pool != nil {
		if q.seen {
			q.pool.RefreshSeed() // two VMs that set a seed at once converge
		} else {
			q.seen = q.pool.Announced()
		}
	}
}

// OnDone lets the proxy finish any context at once. A request still held
// (shaping) is dropped: its stream is ending, so its client went away.
func (vm *VM) OnDone(id uint32) bool {
	vm.endStream(id)
	return true
}

// OnLog has nothing to log. A request still held is dropped, as in OnDone:
// some hosts end a stream with proxy_on_log alone (tetratelabs' proxytest).
// Envoy calls it before proxy_on_done, with the stream's dynamic metadata
// complete: the usage-based limits settle on the first of the two.
func (vm *VM) OnLog(id uint32) { vm.endStream(id) }

// endStream stops holding stream id's request, if it is held, and settles
// its usage-based limits, if it has any.
func (vm *VM) endStream(id uint32) {
	s := vm.streams.get(id)
	if s == nil || (s.state != stateHeld && s.state != stateWaiting && !s.usage.armed) {
		return // the common case, without a deferred recover
	}
	defer vm.recoverRoot("ending a stream")
	switch s.state {
	case stateHeld:
		s.plugin.unhold(s)
	case stateWaiting:
		s.plugin.unwait(s)
	}
	s.plugin.settleStream(s)
}

// OnDelete forgets a context. A stream whose call is still out is kept
// until the answer (which still teaches the precheck) or the tick.
func (vm *VM) OnDelete(id uint32) {
	defer vm.recoverRoot("proxy_on_delete")
	if s := vm.streams.remove(id); s != nil {
		switch s.state {
		case stateHeld:
			s.plugin.unhold(s)
		case stateWaiting:
			s.plugin.unwait(s)
		}
		s.plugin.settleStream(s) // a host that ends streams with proxy_on_delete alone
		s.deleted = true
		vm.release(s)
		return
	}
	if p := vm.removeRoot(id); p != nil {
		p.calls = nil
		p.settle.drop(p)
	}
}

// removeRoot forgets the plugin instance of root context id and returns it,
// or nil if there is none.
func (vm *VM) removeRoot(id uint32) *Plugin {
	for i, p := range vm.roots {
		if p.id == id {
			vm.roots = append(vm.roots[:i], vm.roots[i+1:]...)
			return p
		}
	}
	return nil
}

// release returns a deleted stream with no call out to the pool.
func (vm *VM) release(s *stream) {
	if !s.deleted || s.state == statePending {
		return
	}
	s.plugin = nil
	vm.free = append(vm.free, s)
}

// recoverStream, deferred, turns a panic in a stream callback into the
// failure mode for that stream. paused says whether the request waits for
// the callback (an answer) rather than for its return value.
func (vm *VM) recoverStream(callback string, action *uint32, paused bool) {
	vm.handlePanic(recover(), callback, action, paused)
}

// handlePanic is recoverStream's work for the value r it recovered (nil
// when there was no panic).
func (vm *VM) handlePanic(r any, callback string, action *uint32, paused bool) {
	s := vm.current
	vm.current = nil
	if r == nil {
		return
	}
	vm.host.Log(LogCritical, "sluice: panic in "+callback+": "+panicText(r))
	if s == nil || s.plugin == nil {
		*action = ActionContinue
		return
	}
	p := s.plugin
	if s.state == statePending && !paused {
		delete(p.calls, s.callID) // its answer will be ignored
	}
	*action = p.failSafely(s, "panic in "+callback, paused)
	s.state = stateDone
	vm.release(s)
}

// recoverRoot, deferred, logs a panic in a callback without a stream.
func (vm *VM) recoverRoot(callback string) {
	if r := recover(); r != nil {
		vm.host.Log(LogCritical, "sluice: panic in "+callback+": "+panicText(r))
	}
}

func panicText(r any) string {
	switch v := r.(type) {
	case error:
		return v.Error()
	case string:
		return v
	}
	return "(non-error value)"
}
