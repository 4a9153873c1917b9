package main

import (
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// VM receives the proxy-wasm callbacks of one Wasm VM (one Envoy worker
// thread) and turns them into the hooks of the filter's core: a root
// context is a core.Worker (one per filter configuration sharing the VM),
// a stream context a core.Exchange of it. It implements abi.Handler.
//
// The answers of calls, over proxy_http_call or proxy_grpc_call, reach the
// core in one form (rlsproto.Answer) with their call's id: Envoy numbers
// the two kinds apart (the id's low bits say which), so one table of calls
// holds both.
type VM struct {
	proxy   proxy
	roots   []*root     // the configurations; a VM has one or a few
	streams streamTable // the streams, by context id
	free    []*stream   // streams kept for reuse
	// current is the context the host calls act on now (the callback's, or
	// the effective context last set), so that a stream's handle sets it
	// only when it changes.
	current uint32
	// deciding is the stream whose request headers are being decided, for
	// RecoverRequestHeaders.
	deciding *stream
	answer   rlsproto.Answer       // scratch: the answer being delivered
	response rlsproto.HTTPResponse // proxy.calls, converted once
}

// newVM returns a VM that talks to the proxy through p.
//
//lint:ignore U1000 main.go, built for wasip1 only, calls it
func newVM(p proxy) *VM {
	return &VM{proxy: p, response: p.calls}
}

// root returns the root context id, or nil.
func (vm *VM) root(id uint32) *root {
	for _, r := range vm.roots {
		if r.id == id {
			return r
		}
	}
	return nil
}

// enter makes context id the one the host calls act on, as a callback of
// it begins.
func (vm *VM) enter(id uint32) { vm.current = id }

// OnVMStart accepts the VM; the VM configuration is not used.
func (vm *VM) OnVMStart(rootID uint32, configSize int) bool { return true }

// OnContextCreate creates a root context (parent 0) or a stream.
func (vm *VM) OnContextCreate(id, parent uint32) {
	vm.enter(id)
	if parent == 0 {
		vm.removeRoot(id)
		vm.roots = append(vm.roots, newRoot(vm, id))
		return
	}
	r := vm.root(parent)
	if r == nil {
		return
	}
	var s *stream
	if n := len(vm.free); n > 0 {
		s = vm.free[n-1]
		vm.free = vm.free[:n-1]
	} else {
		s = &stream{vm: vm}
	}
	s.id, s.root = id, r
	s.x = r.w.Open(s)
	vm.streams.put(id, s)
}

// OnConfigure configures a root context; false refuses the configuration
// (the proxy then rejects the filter).
func (vm *VM) OnConfigure(rootID uint32, configSize int) bool {
	vm.enter(rootID)
	r := vm.root(rootID)
	if r == nil {
		r = newRoot(vm, rootID)
		vm.roots = append(vm.roots, r)
	}
	data, err := vm.proxy.root.PluginConfiguration(configSize)
	if err != nil {
		vm.proxy.root.Log(abi.LogError, "sluice: cannot read the plugin configuration: "+err.Error())
		return false
	}
	return r.w.Configure(data)
}

// RequestHeaders decides a request. It does not recover from a panic: the
// abi callback does, and calls RecoverRequestHeaders (a second deferred
// recover would cost the hottest callback as much again as its frame).
func (vm *VM) RequestHeaders(id uint32, numHeaders int, endOfStream bool) uint32 {
	s := vm.streams.get(id)
	if s == nil {
		return abi.ActionContinue
	}
	vm.current, vm.deciding = id, s
	s.noBody = endOfStream
	action := s.root.w.RequestHeaders(s.x)
	vm.deciding = nil
	return uint32(action)
}

// RecoverRequestHeaders handles a panic r recovered from RequestHeaders as
// the failure mode of the stream it was deciding, and returns the
// callback's action.
func (vm *VM) RecoverRequestHeaders(r any) uint32 {
	s := vm.deciding
	vm.deciding = nil
	if s == nil {
		return abi.ActionContinue
	}
	return uint32(s.root.w.Recover(s.x, r))
}

// WantsRequestBody reports whether stream id's request is undecided: its
// body waits with it, or is read for its reserve.
func (vm *VM) WantsRequestBody(id uint32) bool {
	s := vm.streams.get(id)
	return s != nil && s.x.Undecided()
}

// OnRequestBody is told of the request body of an undecided request: it
// waits with its request (the host buffers it), or is read for its
// reserve, which may decide the request.
func (vm *VM) OnRequestBody(id uint32, bodySize int, endOfStream bool) uint32 {
	s := vm.streams.get(id)
	if s == nil {
		return abi.ActionContinue
	}
	vm.enter(id)
	return uint32(s.root.w.RequestBody(s.x, bodySize, endOfStream))
}

// OnResponseHeaders adds the rate limit headers to an admitted request's
// response.
func (vm *VM) OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) uint32 {
	if s := vm.streams.get(id); s != nil {
		vm.enter(id)
		s.root.w.ResponseHeaders(s.x, endOfStream)
	}
	return abi.ActionContinue
}

// OnResponseBody counts a chunk of the response body.
func (vm *VM) OnResponseBody(id uint32, bodySize int, endOfStream bool) uint32 {
	if s := vm.streams.get(id); s != nil {
		vm.enter(id)
		s.chunk = bodySize
		s.root.w.ResponseBody(s.x, bodySize, endOfStream)
	}
	return abi.ActionContinue
}

// OnResponseTrailers reads the response trailers.
func (vm *VM) OnResponseTrailers(id uint32, numTrailers int) uint32 {
	if s := vm.streams.get(id); s != nil {
		vm.enter(id)
		s.root.w.ResponseTrailers(s.x)
	}
	return abi.ActionContinue
}

// OnHTTPCallResponse takes the answer to a call made over proxy_http_call
// (numHeaders 0: none came, the call failed or timed out).
func (vm *VM) OnHTTPCallResponse(rootID, callID uint32, numHeaders, bodySize, numTrailers int) {
	r := vm.root(rootID)
	if r == nil {
		return
	}
	vm.enter(rootID)
	if numHeaders == 0 {
		vm.answer = rlsproto.NoAnswer()
	} else {
		vm.answer = rlsproto.ReadHTTPAnswer(vm.response, bodySize)
	}
	r.w.Answer(callID, &vm.answer)
	vm.answer = rlsproto.Answer{}
}

// OnGRPCReceive takes the response message of a call made over
// proxy_grpc_call (transport "grpc"): the proxy's gRPC client has checked
// the HTTP and gRPC statuses and unframed the message.
func (vm *VM) OnGRPCReceive(rootID, callID uint32, size int) {
	r := vm.root(rootID)
	if r == nil {
		return
	}
	vm.enter(rootID)
	if size > rlsproto.MaxAnswer {
		vm.answer = rlsproto.TooLarge(size)
	} else {
		vm.answer = rlsproto.GRPCMessage(vm.proxy.calls.GRPCMessage(size))
	}
	r.w.Answer(callID, &vm.answer)
	vm.answer = rlsproto.Answer{}
}

// OnGRPCClose takes the end of a call made over proxy_grpc_call that
// failed with a gRPC status.
func (vm *VM) OnGRPCClose(rootID, callID, status uint32) {
	r := vm.root(rootID)
	if r == nil {
		return
	}
	vm.enter(rootID)
	_, msg := vm.proxy.calls.GRPCStatus()
	vm.answer = rlsproto.GRPCFailure(status, msg)
	r.w.Answer(callID, &vm.answer)
	vm.answer = rlsproto.Answer{}
}

// OnTick runs a root context's tick.
func (vm *VM) OnTick(rootID uint32) {
	if r := vm.root(rootID); r != nil {
		vm.enter(rootID)
		r.w.Tick()
	}
}

// OnDone lets the proxy finish any context at once. A request still held
// (shaping) is dropped: its stream is ending, so its client went away.
func (vm *VM) OnDone(id uint32) bool {
	vm.endStream(id)
	return true
}

// OnLog ends the stream, as OnDone: some hosts end a stream with
// proxy_on_log alone (tetratelabs' proxytest). Envoy calls it before
// proxy_on_done, with the stream's dynamic metadata complete: the
// usage-based limits settle on the first of the two.
func (vm *VM) OnLog(id uint32) { vm.endStream(id) }

// endStream tells the core that stream id ended.
func (vm *VM) endStream(id uint32) {
	if s := vm.streams.get(id); s != nil {
		vm.enter(id)
		s.root.w.End(s.x)
	}
}

// OnDelete forgets a context.
func (vm *VM) OnDelete(id uint32) {
	vm.enter(id)
	if s := vm.streams.remove(id); s != nil {
		s.root.w.Close(s.x)
		s.x, s.root = nil, nil
		vm.free = append(vm.free, s)
		return
	}
	if r := vm.removeRoot(id); r != nil {
		r.w.Stop()
	}
}

// removeRoot forgets root context id and returns it, or nil if there is
// none.
func (vm *VM) removeRoot(id uint32) *root {
	for i, r := range vm.roots {
		if r.id == id {
			vm.roots = append(vm.roots[:i], vm.roots[i+1:]...)
			return r
		}
	}
	return nil
}
