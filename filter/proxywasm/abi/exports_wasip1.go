//go:build wasip1

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, which staticcheck cannot see

package abi

// The callbacks of ABI 0.2.1 the filter implements. Each one marks its span
// on the scratch arena and recovers from a panic the handler let through, so
// that a bug never traps the module (a trapped module fails every later
// request). The handler applies the policy's failure mode itself; these
// recovers are the last line and pick the least harmful answer.

// handler is the Handler the exported callbacks forward to.
var handler Handler

// SetHandler installs the handler of all callbacks. Call it from an init
// function: the host may call back as soon as _initialize returns.
func SetHandler(h Handler) { handler = h }

// arenaSize is the scratch memory of one callback. Header values, the
// plugin configuration and a control-plane reply normally fit.
const arenaSize = 64 << 10

// scratch serves proxy_on_memory_allocate.
var scratch = newArena(arenaSize)

// guard ends a callback: it leaves the arena and swallows a panic, logging it.
func guard() {
	scratch.leave()
	if r := recover(); r != nil {
		logPanic(r)
	}
}

func logPanic(r any) {
	msg := "sluice: panic in a proxy-wasm callback"
	if e, ok := r.(error); ok {
		msg += ": " + e.Error()
	} else if s, ok := r.(string); ok {
		msg += ": " + s
	}
	proxyLog(LogCritical, msg)
}

// guardRequestHeaders ends proxy_on_request_headers: it leaves the arena
// and hands a panic to the handler, whose answer becomes the action. A
// panic in the handler's recovery is logged, and the request continues.
func guardRequestHeaders(action *uint32) {
	r := recover()
	if r == nil {
		scratch.leave()
		return
	}
	*action = ActionContinue
	defer guard()
	*action = handler.RecoverRequestHeaders(r)
}

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion021() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) uint32 {
	return uint32(uintptr(scratch.alloc(int(size))))
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, configSize uint32) (ok bool) {
	scratch.enter()
	defer guard()
	return handler.OnVMStart(rootID, int(configSize))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, configSize uint32) (ok bool) {
	scratch.enter()
	defer guard()
	return handler.OnConfigure(rootID, int(configSize))
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {
	scratch.enter()
	defer guard()
	handler.OnContextCreate(id, parent)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, numHeaders uint32, endOfStream bool) (action uint32) {
	scratch.enter()
	defer guardRequestHeaders(&action)
	return handler.RequestHeaders(id, int(numHeaders), endOfStream)
}

// proxyOnRequestBody is called for every chunk of every request body, so
// its common case (a request decided, whose body goes on) returns at once:
// no arena, no deferred recover.
//
//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(id, bodySize uint32, endOfStream bool) (action uint32) {
	if !handler.WantsRequestBody(id) {
		return ActionContinue
	}
	scratch.enter()
	defer guard()
	return handler.OnRequestBody(id, int(bodySize), endOfStream)
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, numHeaders uint32, endOfStream bool) (action uint32) {
	scratch.enter()
	defer guard()
	return handler.OnResponseHeaders(id, int(numHeaders), endOfStream)
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(id, bodySize uint32, endOfStream bool) (action uint32) {
	scratch.enter()
	defer guard()
	return handler.OnResponseBody(id, int(bodySize), endOfStream)
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(id, numTrailers uint32) (action uint32) {
	scratch.enter()
	defer guard()
	return handler.OnResponseTrailers(id, int(numTrailers))
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootID, callID, numHeaders, bodySize, numTrailers uint32) {
	scratch.enter()
	defer guard()
	handler.OnHTTPCallResponse(rootID, callID, int(numHeaders), int(bodySize), int(numTrailers))
}

//go:wasmexport proxy_on_grpc_receive
func proxyOnGRPCReceive(rootID, callID, size uint32) {
	scratch.enter()
	defer guard()
	handler.OnGRPCReceive(rootID, callID, int(size))
}

//go:wasmexport proxy_on_grpc_close
func proxyOnGRPCClose(rootID, callID, status uint32) {
	scratch.enter()
	defer guard()
	handler.OnGRPCClose(rootID, callID, status)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	scratch.enter()
	defer guard()
	handler.OnTick(rootID)
}

//go:wasmexport proxy_on_done
func proxyOnDone(id uint32) (done bool) {
	done = true // on a panic, let the host finish the context
	scratch.enter()
	defer guard()
	return handler.OnDone(id)
}

//go:wasmexport proxy_on_log
func proxyOnLog(id uint32) {
	scratch.enter()
	defer guard()
	handler.OnLog(id)
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {
	scratch.enter()
	defer guard()
	handler.OnDelete(id)
}
