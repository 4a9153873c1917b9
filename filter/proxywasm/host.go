package main

import (
	"github.com/sluicehq/sluice/filter/core"
	"github.com/sluicehq/sluice/filter/core/config"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/abi"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// proxy is the proxy-wasm host's functions as the VM uses them. Its field
// types are package abi's Host, Stream and CallResponse in filter.wasm
// (proxy_wasip1.go), the sluicetest build's stubs around them
// (testexport_wasip1.go), and the interfaces below in a native build, which
// only compiles: they are concrete types in filter.wasm so that a host call
// costs the guest one dispatch (core.Stream's), not two.
type proxy struct {
	root   rootAPI
	stream streamAPI
	calls  callAPI
}

// rootProxy is the host functions that act on no stream.
type rootProxy interface {
	Now() int64
	WallNow() int64
	Log(level uint32, msg string)
	PluginConfiguration(size int) ([]byte, error)
	HTTPCall(cluster string, headers, body []byte, timeoutMs uint32) (uint32, error)
	GRPCCall(service []byte, serviceName, method string, message []byte, timeoutMs uint32) (uint32, error)
	SetTickPeriod(ms uint32) error
	DefineCounter(name string) (uint32, error)
	DefineGauge(name string) (uint32, error)
	IncrementCounter(id uint32, delta int64)
	shareddata.Data
}

// streamProxy is the host functions that act on the current stream (the
// effective context).
type streamProxy interface {
	RequestHeader(name string) (string, bool)
	RemoteAddress() (string, bool)
	ResponseHeader(name string) (string, bool)
	ResponseTrailer(name string) (string, bool)
	Property(path string) ([]byte, bool)
	Body(request bool, start, size int) ([]byte, error)
	SetResponseBody(size int, data []byte) error
	AddRequestHeader(name, value string) error
	AddResponseHeader(name, value string) error
	ResumeRequest() error
	SendLocalResponse(status uint32, details string, body, headers []byte) abi.Status
	SetEffectiveContext(id uint32) error
}

// callProxy reads the answer of a call being delivered.
type callProxy interface {
	rlsproto.HTTPResponse
	GRPCMessage(size int) ([]byte, error)
	GRPCStatus() (code uint32, message string)
}

// tickPeriodMs is the longest tick period a root context asks for.
const tickPeriodMs = 1000

// root is a root context: one configuration of the filter in this VM, and
// the core.Host of its core.Worker.
type root struct {
	id     uint32
	vm     *VM
	w      *core.Worker
	tickMs uint32 // the tick period last set
}

var _ core.Host = (*root)(nil)

// newRoot returns root context id of vm, with its worker.
func newRoot(vm *VM, id uint32) *root {
	r := &root{id: id, vm: vm}
	r.w = core.NewWorker(r)
	return r
}

// Now implements core.Host: WASI's monotonic clock, which every VM of the
// proxy reads alike.
func (r *root) Now() int64 { return r.vm.proxy.root.Now() }

// WallNow implements core.Host.
func (r *root) WallNow() int64 { return r.vm.proxy.root.WallNow() }

// Log implements core.Host (the levels are proxy-wasm's).
func (r *root) Log(level core.Level, msg string) { r.vm.proxy.root.Log(uint32(level), msg) }

// DefineMetric implements core.Host.
func (r *root) DefineMetric(kind core.MetricKind, name string) (uint32, error) {
	if kind == core.Gauge {
		return r.vm.proxy.root.DefineGauge(name)
	}
	return r.vm.proxy.root.DefineCounter(name)
}

// IncrementMetric implements core.Host.
func (r *root) IncrementMetric(id uint32, delta int64) { r.vm.proxy.root.IncrementCounter(id, delta) }

// Call implements core.Host: over proxy_grpc_call when the call names a
// GrpcService (transport "grpc"), else over proxy_http_call. Either way the
// call belongs to the root context, whose callbacks get its answer.
func (r *root) Call(from core.Stream, c *core.Call) (uint32, error) {
	if c.GRPCService != nil {
		return r.vm.proxy.root.GRPCCall(c.GRPCService, rlsproto.ServiceName, rlsproto.MethodName,
			c.Frame[rlsproto.FrameHeaderLen:], c.TimeoutMs)
	}
	return r.vm.proxy.root.HTTPCall(c.Cluster, c.Headers, c.Frame, c.TimeoutMs)
}

// Schedule implements core.Host with proxy-wasm's periodic tick: the
// period becomes the delay, in whole milliseconds (at least 1, at most
// tickPeriodMs). A period that does not change is not set again: the next
// tick comes within it anyway, and the core schedules again there.
func (r *root) Schedule(delay int64) {
	ms := uint32(max(1, min(tickPeriodMs, (delay+config.Millisecond-1)/config.Millisecond)))
	if ms == r.tickMs {
		return
	}
	r.tickMs = ms
	if err := r.vm.proxy.root.SetTickPeriod(ms); err != nil {
		r.Log(core.LevelWarn, "sluice: cannot set the tick period: "+err.Error())
	}
}

// Blocks implements core.Host: the blocks in the proxy's shared data.
func (r *root) Blocks(domain string) core.Blocks {
	return shareddata.New(r.vm.proxy.root, domain, shareddata.Slots)
}

// Pools implements core.Host: the pools in the proxy's shared data, or in
// a store of this VM's own (perWorker).
func (r *root) Pools(domain string, perWorker bool) lease.Pools {
	var data shareddata.Data = r.vm.proxy.root
	if perWorker {
		data = shareddata.NewLocal()
	}
	return shareddata.NewLeases(data, domain, shareddata.LeaseSlots)
}

// stream is a stream context, and the core.Stream of its exchange.
type stream struct {
	id     uint32
	vm     *VM
	root   *root
	x      *core.Exchange
	noBody bool // the request ended with its headers
	chunk  int  // the size of the response body chunk being delivered
}

var _ core.Stream = (*stream)(nil)

// enter makes s the context the host calls act on, when it is not already
// (the core acts on a stream from a root context's callback too: an
// answer, a tick).
func (s *stream) enter() error {
	if s.vm.current == s.id {
		return nil // (small enough to inline: every host call of a stream starts here)
	}
	return s.switchTo()
}

// switchTo sets the effective context to s.
func (s *stream) switchTo() error {
	if err := s.vm.proxy.stream.SetEffectiveContext(s.id); err != nil {
		return err
	}
	s.vm.current = s.id
	return nil
}

// RequestHeader implements core.Stream.
func (s *stream) RequestHeader(name string) (string, bool) {
	if s.enter() != nil {
		return "", false
	}
	return s.vm.proxy.stream.RequestHeader(name)
}

// RemoteAddress implements core.Stream.
func (s *stream) RemoteAddress() (string, bool) {
	if s.enter() != nil {
		return "", false
	}
	return s.vm.proxy.stream.RemoteAddress()
}

// ResponseHeader implements core.Stream.
func (s *stream) ResponseHeader(name string) (string, bool) {
	if s.enter() != nil {
		return "", false
	}
	return s.vm.proxy.stream.ResponseHeader(name)
}

// ResponseTrailer implements core.Stream.
func (s *stream) ResponseTrailer(name string) (string, bool) {
	if s.enter() != nil {
		return "", false
	}
	return s.vm.proxy.stream.ResponseTrailer(name)
}

// DynamicMetadata implements core.Stream: Envoy's "metadata" property is
// the stream's dynamic metadata.
func (s *stream) DynamicMetadata(namespace, key string) ([]byte, bool) {
	if s.enter() != nil {
		return nil, false
	}
	return s.vm.proxy.stream.Property("metadata\x00filter_metadata\x00" + namespace + "\x00" + key)
}

// RequestBody implements core.Stream.
func (s *stream) RequestBody(start, max int) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	return s.vm.proxy.stream.Body(true, start, max)
}

// ResponseBody implements core.Stream.
func (s *stream) ResponseBody(start, max int) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	return s.vm.proxy.stream.Body(false, start, max)
}

// RequestEnded implements core.Stream.
func (s *stream) RequestEnded() bool { return s.noBody }

// SetResponseBody implements core.Stream with proxy_set_buffer_bytes.
func (s *stream) SetResponseBody(data []byte) error {
	if err := s.enter(); err != nil {
		return err
	}
	return s.vm.proxy.stream.SetResponseBody(s.chunk, data)
}

// EndResponse implements core.Stream: proxy-wasm has no way to end a
// response early (proxy_close_stream resets it: the client would get an
// error, perhaps before the cut event), so the core empties the chunks
// that follow, and the stream ends with the upstream's.
func (s *stream) EndResponse() bool { return false }

// AddRequestHeader implements core.Stream.
func (s *stream) AddRequestHeader(name, value string) error {
	if err := s.enter(); err != nil {
		return err
	}
	return s.vm.proxy.stream.AddRequestHeader(name, value)
}

// AddResponseHeader implements core.Stream.
func (s *stream) AddResponseHeader(name, value string) error {
	if err := s.enter(); err != nil {
		return err
	}
	return s.vm.proxy.stream.AddResponseHeader(name, value)
}

// Resume implements core.Stream.
func (s *stream) Resume() error {
	if err := s.enter(); err != nil {
		return err
	}
	return s.vm.proxy.stream.ResumeRequest()
}

// SendLocalReply implements core.Stream.
func (s *stream) SendLocalReply(status uint32, details string, body, headers []byte) error {
	if err := s.enter(); err != nil {
		return err
	}
	if st := s.vm.proxy.stream.SendLocalResponse(status, details, body, headers); st != abi.StatusOK {
		return st
	}
	return nil
}

var _ core.Blocks = (*shareddata.Store)(nil)
