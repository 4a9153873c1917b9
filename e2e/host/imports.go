package host

import (
	"context"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// hostFunc is one function of the "env" module.
type hostFunc struct {
	params []api.ValueType                 // every function returns one i32 status
	fn     func(vm *VM, s []uint64) Status // reads its parameters from s
}

// i32s returns n i32 parameter types.
func i32s(n int) []api.ValueType {
	ts := make([]api.ValueType, n)
	for i := range ts {
		ts[i] = api.ValueTypeI32
	}
	return ts
}

// u32 reads parameter i of s as a uint32.
func u32(s []uint64, i int) uint32 { return uint32(s[i]) }

// hostFuncs is every "env" import this host implements: proxy-wasm ABI 0.2.1
// (without gRPC calls) plus the 0.1.0 names proxy_continue_request,
// proxy_continue_response, proxy_clear_route_cache and
// proxy_get_configuration. A module importing anything else is refused.
var hostFuncs = map[string]hostFunc{
	"proxy_log":                          {i32s(3), hostLog},
	"proxy_get_log_level":                {i32s(1), hostGetLogLevel},
	"proxy_get_current_time_nanoseconds": {i32s(1), hostGetCurrentTime},
	"proxy_set_tick_period_milliseconds": {i32s(1), hostSetTickPeriod},
	"proxy_get_buffer_bytes":             {i32s(5), hostGetBufferBytes},
	"proxy_set_buffer_bytes":             {i32s(5), hostSetBufferBytes},
	"proxy_get_buffer_status":            {i32s(3), hostGetBufferStatus},
	"proxy_get_header_map_pairs":         {i32s(3), hostGetHeaderMapPairs},
	"proxy_set_header_map_pairs":         {i32s(3), hostSetHeaderMapPairs},
	"proxy_get_header_map_size":          {i32s(2), hostGetHeaderMapSize},
	"proxy_get_header_map_value":         {i32s(5), hostGetHeaderMapValue},
	"proxy_add_header_map_value":         {i32s(5), hostAddHeaderMapValue},
	"proxy_replace_header_map_value":     {i32s(5), hostReplaceHeaderMapValue},
	"proxy_remove_header_map_value":      {i32s(3), hostRemoveHeaderMapValue},
	"proxy_continue_stream":              {i32s(1), hostContinueStream},
	"proxy_close_stream":                 {i32s(1), hostCloseStream},
	"proxy_continue_request":             {i32s(0), hostContinueRequest},
	"proxy_continue_response":            {i32s(0), hostContinueResponse},
	"proxy_clear_route_cache":            {i32s(0), hostClearRouteCache},
	"proxy_get_configuration":            {i32s(2), hostGetConfiguration},
	"proxy_get_status":                   {i32s(3), hostGetStatus},
	"proxy_send_local_response":          {i32s(8), hostSendLocalResponse},
	"proxy_http_call":                    {i32s(10), hostHTTPCall},
	"proxy_get_shared_data":              {i32s(5), hostGetSharedData},
	"proxy_set_shared_data":              {i32s(5), hostSetSharedData},
	"proxy_register_shared_queue":        {i32s(3), hostRegisterSharedQueue},
	"proxy_resolve_shared_queue":         {i32s(5), hostResolveSharedQueue},
	"proxy_enqueue_shared_queue":         {i32s(3), hostEnqueueSharedQueue},
	"proxy_dequeue_shared_queue":         {i32s(3), hostDequeueSharedQueue},
	"proxy_define_metric":                {i32s(4), hostDefineMetric},
	"proxy_increment_metric":             {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI64}, hostIncrementMetric},
	"proxy_record_metric":                {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI64}, hostRecordMetric},
	"proxy_get_metric":                   {i32s(2), hostGetMetric},
	"proxy_get_property":                 {i32s(4), hostGetProperty},
	"proxy_set_property":                 {i32s(4), hostSetProperty},
	"proxy_set_effective_context":        {i32s(1), hostSetEffectiveContext},
	"proxy_done":                         {i32s(0), hostDone},
	"proxy_call_foreign_function":        {i32s(6), hostCallForeignFunction},
}

// callbackSig is the type of an exported callback.
type callbackSig struct {
	params  []api.ValueType // all i32
	results []api.ValueType // none or one i32
}

// callbackSigs lists the callbacks this host calls, with their ABI types.
var callbackSigs = map[string]callbackSig{
	"proxy_on_memory_allocate":    {i32s(1), i32s(1)},
	"malloc":                      {i32s(1), i32s(1)},
	"proxy_on_context_create":     {i32s(2), nil},
	"proxy_on_vm_start":           {i32s(2), i32s(1)},
	"proxy_on_configure":          {i32s(2), i32s(1)},
	"proxy_on_tick":               {i32s(1), nil},
	"proxy_on_request_headers":    {i32s(3), i32s(1)},
	"proxy_on_request_body":       {i32s(3), i32s(1)},
	"proxy_on_request_trailers":   {i32s(2), i32s(1)},
	"proxy_on_response_headers":   {i32s(3), i32s(1)},
	"proxy_on_response_body":      {i32s(3), i32s(1)},
	"proxy_on_response_trailers":  {i32s(2), i32s(1)},
	"proxy_on_http_call_response": {i32s(5), nil},
	"proxy_on_queue_ready":        {i32s(2), nil},
	"proxy_on_log":                {i32s(1), nil},
	"proxy_on_done":               {i32s(1), i32s(1)},
	"proxy_on_delete":             {i32s(1), nil},
	"_initialize":                 {nil, nil},
	"_start":                      {nil, nil},
	"main":                        {i32s(2), i32s(1)},
}

// instantiateEnv registers hostFuncs as the "env" module.
func (h *Host) instantiateEnv(ctx context.Context) error {
	b := h.runtime.NewHostModuleBuilder("env")
	for name, hf := range hostFuncs {
		fn := hf.fn
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
				vm, _ := ctx.Value(vmKey{}).(*VM)
				if vm == nil || vm.mem == nil {
					stack[0] = uint64(StatusInternalFailure)
					return
				}
				stack[0] = uint64(fn(vm, stack))
			}), hf.params, i32s(1)).
			Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// hostLog is proxy_log(level, message, size).
func hostLog(vm *VM, s []uint64) Status {
	level := LogLevel(u32(s, 0))
	if level > LogCritical {
		return StatusBadArgument
	}
	msg, ok := vm.readString(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	vm.log(level, msg)
	return StatusOK
}

// hostGetLogLevel is proxy_get_log_level(return_level).
func hostGetLogLevel(vm *VM, s []uint64) Status {
	if !vm.mem.WriteUint32Le(u32(s, 0), uint32(vm.host.level)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostGetCurrentTime is proxy_get_current_time_nanoseconds(return_time).
func hostGetCurrentTime(vm *VM, s []uint64) Status {
	if !vm.mem.WriteUint64Le(u32(s, 0), uint64(vm.host.cfg.Now().UnixNano())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostSetTickPeriod is proxy_set_tick_period_milliseconds(period); it always
// applies to the VM's root context, as in proxy-wasm-cpp-host.
func hostSetTickPeriod(vm *VM, s []uint64) Status {
	vm.setTickPeriod(time.Duration(u32(s, 0)) * time.Millisecond)
	return StatusOK
}

// buffer finds buffer bt for the target context. set is nil for read-only
// buffers.
func (vm *VM) buffer(bt BufferType) (data []byte, set func([]byte), st Status) {
	if bt > BufferForeignArguments {
		return nil, nil, StatusBadArgument
	}
	t := vm.target()
	switch bt {
	case BufferRequestBody:
		if t != nil && t.reqBodyAvail {
			return t.reqBody, func(b []byte) { t.reqBody = b }, StatusOK
		}
	case BufferResponseBody:
		if t != nil && t.respBodyAvail {
			return t.respBody, func(b []byte) { t.respBody = b }, StatusOK
		}
	case BufferHTTPCallResponse:
		if vm.callResp != nil {
			return vm.callResp.body, nil, StatusOK
		}
	case BufferVMConfiguration:
		return vm.host.cfg.VMConfig, nil, StatusOK
	case BufferPluginConfiguration:
		if vm.configuring {
			return vm.host.cfg.PluginConfig, nil, StatusOK
		}
	}
	return nil, nil, StatusNotFound
}

// hostGetBufferBytes is proxy_get_buffer_bytes(type, start, max_size,
// return_data, return_size): up to max_size bytes from start, clamped to the
// buffer as Envoy does.
func hostGetBufferBytes(vm *VM, s []uint64) Status {
	data, _, st := vm.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	start, length := uint64(u32(s, 1)), uint64(u32(s, 2))
	if start > uint64(len(data)) {
		return StatusBadArgument
	}
	if start+length > uint64(len(data)) {
		length = uint64(len(data)) - start
	}
	return vm.copyOut(data[start:start+length], u32(s, 3), u32(s, 4))
}

// hostSetBufferBytes is proxy_set_buffer_bytes(type, start, size, data,
// data_size), with Envoy's Buffer::copyFrom rules: start 0 and size 0
// prepends, start 0 and size >= length replaces, start >= length appends;
// anything else is BAD_ARGUMENT.
func hostSetBufferBytes(vm *VM, s []uint64) Status {
	data, set, st := vm.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	if set == nil {
		return StatusBadArgument
	}
	value, ok := vm.read(u32(s, 3), u32(s, 4))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	start, size := uint64(u32(s, 1)), uint64(u32(s, 2))
	n := uint64(len(data))
	switch {
	case start == 0 && size == 0:
		set(append(append([]byte(nil), value...), data...))
	case start == 0 && size >= n:
		set(append([]byte(nil), value...))
	case start >= n:
		set(append(append([]byte(nil), data...), value...))
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// hostGetBufferStatus is proxy_get_buffer_status(type, return_size,
// return_flags).
func hostGetBufferStatus(vm *VM, s []uint64) Status {
	data, _, st := vm.buffer(BufferType(u32(s, 0)))
	if st != StatusOK {
		return st
	}
	if !vm.mem.WriteUint32Le(u32(s, 1), uint32(len(data))) || !vm.mem.WriteUint32Le(u32(s, 2), 0) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// headerMap finds map mt of the target context. write asks for a map the
// guest may change. ok is false when the map does not exist in this phase
// (Envoy: a null map, BAD_ARGUMENT for everything but reading all pairs).
func (vm *VM) headerMap(mt MapType, write bool) (h *Headers, ok bool) {
	t := vm.target()
	switch mt {
	case MapRequestHeaders:
		if t != nil && (t.reqWritable || (!write && t.inLog)) {
			return &t.req, true
		}
	case MapResponseHeaders:
		if t != nil && (t.respWritable || (!write && t.inLog)) {
			return &t.resp, true
		}
	case MapHTTPCallResponseHeaders:
		if vm.callResp != nil && !write {
			return &vm.callResp.headers, true
		}
	case MapHTTPCallResponseTrailers:
		if vm.callResp != nil && !write {
			return &vm.callResp.trailers, true
		}
	}
	return nil, false
}

// hostGetHeaderMapPairs is proxy_get_header_map_pairs(type, return_data,
// return_size).
func hostGetHeaderMapPairs(vm *VM, s []uint64) Status {
	mt := MapType(u32(s, 0))
	if mt > MapHTTPCallResponseTrailers {
		return StatusBadArgument
	}
	var pairs Headers
	if h, ok := vm.headerMap(mt, false); ok {
		pairs = *h
	}
	return vm.copyOutPairs(pairs, u32(s, 1), u32(s, 2))
}

// hostSetHeaderMapPairs is proxy_set_header_map_pairs(type, data, size).
func hostSetHeaderMapPairs(vm *VM, s []uint64) Status {
	mt := MapType(u32(s, 0))
	if mt > MapHTTPCallResponseTrailers {
		return StatusBadArgument
	}
	b, ok := vm.read(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	h, ok := vm.headerMap(mt, true)
	if !ok {
		return StatusBadArgument
	}
	pairs, err := DecodePairs(b)
	if err != nil {
		vm.log(LogWarn, "proxy_set_header_map_pairs: "+err.Error())
		return StatusBadArgument
	}
	for i := range pairs {
		pairs[i][0] = strings.ToLower(pairs[i][0])
	}
	*h = pairs
	return StatusOK
}

// hostGetHeaderMapSize is proxy_get_header_map_size(type, return_size): the
// serialized size, as the specification says.
func hostGetHeaderMapSize(vm *VM, s []uint64) Status {
	mt := MapType(u32(s, 0))
	h, ok := vm.headerMap(mt, false)
	if mt > MapHTTPCallResponseTrailers || !ok {
		return StatusBadArgument
	}
	if !vm.mem.WriteUint32Le(u32(s, 1), uint32(PairsSize(*h))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostGetHeaderMapValue is proxy_get_header_map_value(type, key, key_size,
// return_value, return_size): the first value of the lower-cased key.
func hostGetHeaderMapValue(vm *VM, s []uint64) Status {
	mt := MapType(u32(s, 0))
	if mt > MapHTTPCallResponseTrailers {
		return StatusBadArgument
	}
	key, ok := vm.readString(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	h, ok := vm.headerMap(mt, false)
	if !ok {
		return StatusBadArgument
	}
	key = strings.ToLower(key)
	for _, p := range *h {
		if p[0] == key {
			return vm.copyOut([]byte(p[1]), u32(s, 3), u32(s, 4))
		}
	}
	return StatusNotFound
}

// mapEdit reads the key (and value) of an add/replace/remove call and applies
// op to the writable map.
func mapEdit(vm *VM, s []uint64, withValue bool, op func(h *Headers, key, value string)) Status {
	mt := MapType(u32(s, 0))
	if mt > MapHTTPCallResponseTrailers {
		return StatusBadArgument
	}
	key, ok := vm.readString(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	var value string
	if withValue {
		if value, ok = vm.readString(u32(s, 3), u32(s, 4)); !ok {
			return StatusInvalidMemoryAccess
		}
	}
	h, ok := vm.headerMap(mt, true)
	if !ok {
		return StatusBadArgument
	}
	op(h, key, value)
	return StatusOK
}

// hostAddHeaderMapValue is proxy_add_header_map_value: appends an entry.
func hostAddHeaderMapValue(vm *VM, s []uint64) Status {
	return mapEdit(vm, s, true, func(h *Headers, k, v string) { h.add(k, v) })
}

// hostReplaceHeaderMapValue is proxy_replace_header_map_value: sets the
// single value of a key, adding it when absent.
func hostReplaceHeaderMapValue(vm *VM, s []uint64) Status {
	return mapEdit(vm, s, true, func(h *Headers, k, v string) { h.replace(k, v) })
}

// hostRemoveHeaderMapValue is proxy_remove_header_map_value: removes every
// entry of a key (OK when absent).
func hostRemoveHeaderMapValue(vm *VM, s []uint64) Status {
	return mapEdit(vm, s, false, func(h *Headers, k, _ string) { h.remove(k) })
}

// hostContinueStream is proxy_continue_stream(stream_type).
func hostContinueStream(vm *VM, s []uint64) Status {
	return vm.continueStream(StreamType(u32(s, 0)))
}

// continueStream resumes the target stream's request or response, as Envoy's
// Context::continueStream.
func (vm *VM) continueStream(t StreamType) Status {
	switch t {
	case StreamRequest, StreamResponse:
		if st := vm.target(); st != nil {
			st.resume(t)
		}
		return StatusOK
	case StreamDownstream:
		return StatusOK
	case StreamUpstream:
		return StatusUnimplemented
	}
	return StatusBadArgument
}

// hostCloseStream is proxy_close_stream(stream_type): resets the stream.
func hostCloseStream(vm *VM, s []uint64) Status {
	t := StreamType(u32(s, 0))
	if t > StreamUpstream {
		return StatusBadArgument
	}
	if st := vm.target(); st != nil && (t == StreamRequest || t == StreamResponse) {
		st.reset()
	}
	return StatusOK
}

// hostContinueRequest is the ABI 0.1.0 proxy_continue_request().
func hostContinueRequest(vm *VM, _ []uint64) Status { return vm.continueStream(StreamRequest) }

// hostContinueResponse is the ABI 0.1.0 proxy_continue_response().
func hostContinueResponse(vm *VM, _ []uint64) Status { return vm.continueStream(StreamResponse) }

// hostClearRouteCache is proxy_clear_route_cache(): this host has one route.
func hostClearRouteCache(*VM, []uint64) Status { return StatusOK }

// hostGetConfiguration is the ABI 0.1.0 proxy_get_configuration(return_data,
// return_size): the plugin configuration inside proxy_on_configure, the VM
// configuration elsewhere (Envoy's getConfiguration).
func hostGetConfiguration(vm *VM, s []uint64) Status {
	cfg := vm.host.cfg.VMConfig
	if vm.configuring {
		cfg = vm.host.cfg.PluginConfig
	}
	return vm.copyOut(cfg, u32(s, 0), u32(s, 1))
}

// hostGetStatus is proxy_get_status(return_code, return_message,
// return_message_size): the outcome of the HTTP call being delivered.
func hostGetStatus(vm *VM, s []uint64) Status {
	if !vm.mem.WriteUint32Le(u32(s, 0), vm.status.code) {
		return StatusInvalidMemoryAccess
	}
	return vm.copyOut([]byte(vm.status.message), u32(s, 1), u32(s, 2))
}

// hostSendLocalResponse is proxy_send_local_response(status, details,
// details_size, body, body_size, headers, headers_size, grpc_status).
func hostSendLocalResponse(vm *VM, s []uint64) Status {
	code := u32(s, 0)
	details, ok1 := vm.readString(u32(s, 1), u32(s, 2))
	body, ok2 := vm.read(u32(s, 3), u32(s, 4))
	hdrs, ok3 := vm.read(u32(s, 5), u32(s, 6))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	if code < 100 || code > 999 {
		vm.log(LogWarn, "proxy_send_local_response: status code out of range")
		return StatusBadArgument
	}
	pairs, err := DecodePairs(hdrs)
	if err != nil {
		vm.log(LogWarn, "proxy_send_local_response: headers: "+err.Error())
		return StatusBadArgument
	}
	for i := range pairs {
		pairs[i][0] = strings.ToLower(pairs[i][0])
	}
	if st := vm.target(); st != nil {
		st.sendLocal(&LocalResponse{
			Status:     int(code),
			Body:       append([]byte(nil), body...),
			Headers:    pairs,
			Details:    details,
			GRPCStatus: int32(u32(s, 7)),
		})
	}
	return StatusOK
}

// hostHTTPCall is proxy_http_call(upstream, upstream_size, headers,
// headers_size, body, body_size, trailers, trailers_size, timeout_ms,
// return_token).
func hostHTTPCall(vm *VM, s []uint64) Status {
	cluster, ok1 := vm.readString(u32(s, 0), u32(s, 1))
	hdrs, ok2 := vm.read(u32(s, 2), u32(s, 3))
	body, ok3 := vm.read(u32(s, 4), u32(s, 5))
	trs, ok4 := vm.read(u32(s, 6), u32(s, 7))
	tokenPtr := u32(s, 9)
	if !ok1 || !ok2 || !ok3 || !ok4 || !vm.mem.WriteUint32Le(tokenPtr, 0) {
		return StatusInvalidMemoryAccess
	}
	headers, err := DecodePairs(hdrs)
	if err != nil {
		vm.log(LogWarn, "proxy_http_call: headers: "+err.Error())
		return StatusBadArgument
	}
	trailers, err := DecodePairs(trs)
	if err != nil {
		vm.log(LogWarn, "proxy_http_call: trailers: "+err.Error())
		return StatusBadArgument
	}
	token, st := vm.startHTTPCall(cluster, headers, append([]byte(nil), body...), trailers, time.Duration(u32(s, 8))*time.Millisecond)
	if st != StatusOK {
		return st
	}
	vm.mem.WriteUint32Le(tokenPtr, token)
	return StatusOK
}

// hostGetSharedData is proxy_get_shared_data(key, key_size, return_value,
// return_size, return_cas).
func hostGetSharedData(vm *VM, s []uint64) Status {
	key, ok := vm.readString(u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, cas, found := vm.host.shared.get(key)
	if !found {
		return StatusNotFound
	}
	if st := vm.copyOut(value, u32(s, 2), u32(s, 3)); st != StatusOK {
		return st
	}
	if !vm.mem.WriteUint32Le(u32(s, 4), cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostSetSharedData is proxy_set_shared_data(key, key_size, value,
// value_size, cas).
func hostSetSharedData(vm *VM, s []uint64) Status {
	key, ok1 := vm.readString(u32(s, 0), u32(s, 1))
	value, ok2 := vm.read(u32(s, 2), u32(s, 3))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	return vm.host.shared.set(key, value, u32(s, 4))
}

// hostRegisterSharedQueue is proxy_register_shared_queue(name, name_size,
// return_token).
func hostRegisterSharedQueue(vm *VM, s []uint64) Status {
	name, ok := vm.readString(u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if !vm.mem.WriteUint32Le(u32(s, 2), vm.host.queues.register(name, vm)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostResolveSharedQueue is proxy_resolve_shared_queue(vm_id, vm_id_size,
// name, name_size, return_token); an empty vm_id means this VM's.
func hostResolveSharedQueue(vm *VM, s []uint64) Status {
	vmID, ok1 := vm.readString(u32(s, 0), u32(s, 1))
	name, ok2 := vm.readString(u32(s, 2), u32(s, 3))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	if vmID != "" && vmID != vm.host.cfg.VMID {
		return StatusNotFound
	}
	tok, found := vm.host.queues.resolve(name)
	if !found {
		return StatusNotFound
	}
	if !vm.mem.WriteUint32Le(u32(s, 4), tok) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostEnqueueSharedQueue is proxy_enqueue_shared_queue(token, value,
// value_size); the owner's proxy_on_queue_ready runs after the current call.
func hostEnqueueSharedQueue(vm *VM, s []uint64) Status {
	tok := u32(s, 0)
	value, ok := vm.read(u32(s, 1), u32(s, 2))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	owner, st := vm.host.queues.enqueue(tok, value)
	if st == StatusOK && owner != nil {
		owner.notifyQueue(tok)
	}
	return st
}

// hostDequeueSharedQueue is proxy_dequeue_shared_queue(token, return_value,
// return_size).
func hostDequeueSharedQueue(vm *VM, s []uint64) Status {
	value, st := vm.host.queues.dequeue(u32(s, 0))
	if st != StatusOK {
		return st
	}
	return vm.copyOut(value, u32(s, 1), u32(s, 2))
}

// hostDefineMetric is proxy_define_metric(type, name, name_size,
// return_id).
func hostDefineMetric(vm *VM, s []uint64) Status {
	typ := MetricType(u32(s, 0))
	if typ > MetricHistogram {
		return StatusBadArgument
	}
	name, ok := vm.readString(u32(s, 1), u32(s, 2))
	if !ok || !vm.mem.WriteUint32Le(u32(s, 3), 0) {
		return StatusInvalidMemoryAccess
	}
	id := vm.metricIDs.define(vm.host.metrics.define(typ, name))
	vm.mem.WriteUint32Le(u32(s, 3), id)
	return StatusOK
}

// hostIncrementMetric is proxy_increment_metric(id, delta i64).
func hostIncrementMetric(vm *VM, s []uint64) Status {
	m, ok := vm.metricIDs.lookup(u32(s, 0))
	if !ok {
		return StatusNotFound
	}
	return vm.host.metrics.increment(m, int64(s[1]))
}

// hostRecordMetric is proxy_record_metric(id, value i64).
func hostRecordMetric(vm *VM, s []uint64) Status {
	m, ok := vm.metricIDs.lookup(u32(s, 0))
	if !ok {
		return StatusNotFound
	}
	return vm.host.metrics.record(m, s[1])
}

// hostGetMetric is proxy_get_metric(id, return_value).
func hostGetMetric(vm *VM, s []uint64) Status {
	m, ok := vm.metricIDs.lookup(u32(s, 0))
	if !ok {
		return StatusNotFound
	}
	v, st := vm.host.metrics.get(m)
	if st != StatusOK {
		return st
	}
	if !vm.mem.WriteUint64Le(u32(s, 1), v) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hostGetProperty is proxy_get_property(path, path_size, return_value,
// return_size); path segments are separated by NUL bytes.
func hostGetProperty(vm *VM, s []uint64) Status {
	path, ok := vm.readString(u32(s, 0), u32(s, 1))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, st := vm.property(path)
	if st != StatusOK {
		return st
	}
	return vm.copyOut(value, u32(s, 2), u32(s, 3))
}

// hostSetProperty is proxy_set_property(path, path_size, value,
// value_size): stored on the stream (Envoy's filter state) and readable back
// with proxy_get_property.
func hostSetProperty(vm *VM, s []uint64) Status {
	path, ok1 := vm.readString(u32(s, 0), u32(s, 1))
	value, ok2 := vm.read(u32(s, 2), u32(s, 3))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	st := vm.target()
	if st == nil {
		return StatusNotFound
	}
	if st.props == nil {
		st.props = make(map[string][]byte)
	}
	st.props[path] = append([]byte(nil), value...)
	return StatusOK
}

// hostSetEffectiveContext is proxy_set_effective_context(context_id).
func hostSetEffectiveContext(vm *VM, s []uint64) Status {
	id := u32(s, 0)
	if _, ok := vm.streams[id]; !ok && id != vm.rootID {
		return StatusBadArgument
	}
	vm.effective = id
	return StatusOK
}

// hostDone is proxy_done(): the root context finishes a shutdown it delayed
// by returning false from proxy_on_done.
func hostDone(vm *VM, _ []uint64) Status {
	if vm.target() != nil || !vm.pendingDone {
		return StatusNotFound
	}
	vm.pendingDone = false
	close(vm.doneCh)
	return StatusOK
}

// hostCallForeignFunction is proxy_call_foreign_function: this host
// registers no foreign functions.
func hostCallForeignFunction(vm *VM, s []uint64) Status {
	if _, ok := vm.readString(u32(s, 0), u32(s, 1)); !ok {
		return StatusInvalidMemoryAccess
	}
	if _, ok := vm.read(u32(s, 2), u32(s, 3)); !ok {
		return StatusInvalidMemoryAccess
	}
	return StatusNotFound
}
