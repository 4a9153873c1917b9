package plugin

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
)

// fakeHost is a proxy for the plugin's tests: it serves request headers per
// stream, records what the plugin does, and delivers answers to calls.
type fakeHost struct {
	t       testing.TB
	now     int64
	config  []byte
	current uint32 // the context host calls act on
	quiet   bool   // record nothing that allocates (for the allocation test)

	headers map[uint32]map[string]string // request headers per stream
	remote  map[uint32]string
	// Per stream: response headers, response trailers, properties.
	respHeaders  map[uint32]map[string]string
	respTrailers map[uint32]map[string]string
	props        map[uint32]map[string][]byte
	propReads    int

	calls     []fakeCall
	nextCall  uint32
	callErr   error
	settleErr error // fails the settle calls only

	answer *fakeAnswer // the answer being delivered
	// The status of a gRPC call being closed.
	grpcStatus  uint32
	grpcMessage string

	local    map[uint32]fakeLocal
	resumed  map[uint32]int
	order    []uint32 // streams in the order they were resumed
	addedReq map[uint32][][2]string
	addedRsp map[uint32][][2]string
	logs     []string
	counters map[string]int64
	names    []string // counter names by id-1
	tick     uint32
	tickSets int // SetTickPeriod calls
	locals   int // local responses sent (also when quiet)

	panicOnHeader bool
	panicOnBody   bool

	shared     *sharedData // the proxy's shared data: the same for the VMs of a test
	sharedGets int
	leaseGets  int // the reads of the lease pools' keys
}

type fakeCall struct {
	id      uint32
	stream  uint32
	cluster string
	headers [][2]string
	body    []byte
	timeout uint32
	service []byte // the GrpcService of a proxy_grpc_call; nil for proxy_http_call
}

type fakeAnswer struct {
	headers  map[string]string
	trailers map[string]string
	body     []byte
}

type fakeLocal struct {
	status  uint32
	details string
	body    string
	headers [][2]string
}

func newFakeHost(t testing.TB, config string) *fakeHost {
	return &fakeHost{
		t: t, config: []byte(config), now: 1e12, nextCall: 7,
		headers: map[uint32]map[string]string{}, remote: map[uint32]string{},
		local: map[uint32]fakeLocal{}, resumed: map[uint32]int{},
		addedReq: map[uint32][][2]string{}, addedRsp: map[uint32][][2]string{},
		counters: map[string]int64{}, shared: newSharedData(),
		respHeaders: map[uint32]map[string]string{}, respTrailers: map[uint32]map[string]string{},
		props: map[uint32]map[string][]byte{},
	}
}

func (h *fakeHost) ResponseHeader(name string) (string, bool) {
	v, ok := h.respHeaders[h.current][name]
	return v, ok
}

func (h *fakeHost) ResponseTrailer(name string) (string, bool) {
	v, ok := h.respTrailers[h.current][name]
	return v, ok
}

func (h *fakeHost) Property(path string) ([]byte, bool) {
	h.propReads++
	v, ok := h.props[h.current][path]
	return v, ok
}

func (h *fakeHost) Now() int64 { return h.now }

func (h *fakeHost) Log(level uint32, msg string) {
	h.logs = append(h.logs, []string{"trace", "debug", "info", "warn", "error", "critical"}[level]+": "+msg)
}

func (h *fakeHost) PluginConfiguration(size int) ([]byte, error) {
	if size != len(h.config) {
		h.t.Errorf("configuration size %d, want %d", size, len(h.config))
	}
	return h.config, nil
}

func (h *fakeHost) RequestHeader(name string) (string, bool) {
	if h.panicOnHeader {
		panic("injected failure")
	}
	v, ok := h.headers[h.current][name]
	return v, ok
}

func (h *fakeHost) RemoteAddress() (string, bool) {
	v, ok := h.remote[h.current]
	return v, ok
}

func (h *fakeHost) AddRequestHeader(name, value string) error {
	h.addedReq[h.current] = append(h.addedReq[h.current], [2]string{name, value})
	return nil
}

func (h *fakeHost) AddResponseHeader(name, value string) error {
	h.addedRsp[h.current] = append(h.addedRsp[h.current], [2]string{name, value})
	return nil
}

func (h *fakeHost) ResumeRequest() error {
	h.resumed[h.current]++
	h.order = append(h.order, h.current)
	return nil
}

func (h *fakeHost) SendLocalResponse(status uint32, details string, body, headers []byte) error {
	h.locals++
	if h.quiet {
		return nil
	}
	if _, dup := h.local[h.current]; dup {
		h.t.Errorf("second local response for stream %d", h.current)
	}
	pairs := h.parse(headers)
	h.local[h.current] = fakeLocal{status, details, string(body), pairs}
	return nil
}

// parse deserializes a header map, copying the strings.
func (h *fakeHost) parse(data []byte) [][2]string {
	pairs, err := headermap.Parse(nil, append([]byte(nil), data...))
	if err != nil {
		h.t.Errorf("malformed header map: %v", err)
	}
	return pairs
}

func (h *fakeHost) SetEffectiveContext(id uint32) error {
	if _, ok := h.headers[id]; !ok {
		return errors.New("BAD_ARGUMENT")
	}
	h.current = id
	return nil
}

func (h *fakeHost) HTTPCall(cluster string, headers, body []byte, timeoutMs uint32) (uint32, error) {
	if h.callErr != nil {
		return 0, h.callErr
	}
	if h.settleErr != nil && strings.Contains(string(headers), "x-sluice-settle") {
		return 0, h.settleErr
	}
	h.nextCall++
	h.calls = append(h.calls, fakeCall{id: h.nextCall, stream: h.current, cluster: cluster, headers: h.parse(headers), body: append([]byte(nil), body...), timeout: timeoutMs})
	return h.nextCall, nil
}

func (h *fakeHost) GRPCCall(service []byte, serviceName, method string, message []byte, timeoutMs uint32) (uint32, error) {
	if h.callErr != nil {
		return 0, h.callErr
	}
	if serviceName != rlsproto.ServiceName || method != rlsproto.MethodName {
		h.t.Errorf("gRPC call to %s/%s", serviceName, method)
	}
	h.nextCall++
	h.calls = append(h.calls, fakeCall{id: h.nextCall, stream: h.current, body: append([]byte(nil), message...),
		timeout: timeoutMs, service: append([]byte(nil), service...)})
	return h.nextCall, nil
}

// GRPCMessage returns the answer's body, which for a gRPC call is the bare
// message.
func (h *fakeHost) GRPCMessage(size int) ([]byte, error) { return h.CallResponseBody(size) }

func (h *fakeHost) GRPCStatus() (uint32, string) { return h.grpcStatus, h.grpcMessage }

func (h *fakeHost) CallResponseHeader(name string) (string, bool) {
	v, ok := h.answer.headers[name]
	return v, ok
}

func (h *fakeHost) CallResponseTrailer(name string) (string, bool) {
	v, ok := h.answer.trailers[name]
	return v, ok
}

func (h *fakeHost) CallResponseBody(size int) ([]byte, error) {
	if h.panicOnBody {
		panic(errors.New("injected failure"))
	}
	if size != len(h.answer.body) {
		h.t.Errorf("body size %d, want %d", size, len(h.answer.body))
	}
	return h.answer.body, nil
}

func (h *fakeHost) SetTickPeriod(ms uint32) error {
	h.tick = ms
	h.tickSets++
	return nil
}

func (h *fakeHost) DefineCounter(name string) (uint32, error) {
	for i, n := range h.names {
		if n == name {
			return uint32(i + 1), nil
		}
	}
	h.names = append(h.names, name)
	return uint32(len(h.names)), nil
}

func (h *fakeHost) DefineGauge(name string) (uint32, error) { return h.DefineCounter(name) }

func (h *fakeHost) IncrementCounter(id uint32, delta int64) {
	h.counters[h.names[id-1]] += delta
}

func (h *fakeHost) logged(part string) bool {
	for _, l := range h.logs {
		if strings.Contains(l, part) {
			return true
		}
	}
	return false
}

// grpcOK returns an answer carrying resp with grpc-status 0 in the trailers.
func grpcOK(t testing.TB, resp *rlsv3.RateLimitResponse) *fakeAnswer {
	t.Helper()
	msg, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte{0}
	body = binary.BigEndian.AppendUint32(body, uint32(len(msg)))
	return &fakeAnswer{
		headers:  map[string]string{":status": "200", "content-type": "application/grpc"},
		trailers: map[string]string{"grpc-status": "0"},
		body:     append(body, msg...),
	}
}

// testbed drives a VM with one plugin instance.
type testbed struct {
	t    testing.TB
	host *fakeHost
	vm   *VM
	next uint32
}

const rootID = 1

func newTestbed(t testing.TB, config string) *testbed {
	return newTestbedOn(t, config, newSharedData())
}

// newTestbedOn is newTestbed for a VM of a proxy whose shared data is d.
func newTestbedOn(t testing.TB, config string, d *sharedData) *testbed {
	h := newFakeHost(t, config)
	h.shared = d
	vm := NewVM(h)
	h.current = rootID
	vm.OnContextCreate(rootID, 0)
	if !vm.OnVMStart(rootID, 0) {
		t.Fatal("vm start failed")
	}
	if !vm.OnConfigure(rootID, len(config)) {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	return &testbed{t: t, host: h, vm: vm, next: 100}
}

// request creates a stream and runs its request headers.
func (b *testbed) request(headers map[string]string, remote string) (id, action uint32) {
	b.next++
	id = b.next
	b.host.headers[id] = headers
	if remote != "" {
		b.host.remote[id] = remote
	}
	b.host.current = id
	b.vm.OnContextCreate(id, rootID)
	return id, b.vm.OnRequestHeaders(id, len(headers), true)
}

// deliver delivers an answer to the last call.
func (b *testbed) deliver(a *fakeAnswer) {
	b.t.Helper()
	if len(b.host.calls) == 0 {
		b.t.Fatal("no call to answer")
	}
	c := b.host.calls[len(b.host.calls)-1]
	b.host.answer = a
	b.host.current = rootID
	if a == nil {
		b.vm.OnHTTPCallResponse(rootID, c.id, 0, 0, 0)
		return
	}
	b.vm.OnHTTPCallResponse(rootID, c.id, len(a.headers), len(a.body), len(a.trailers))
	b.host.answer = nil
}

// respond runs a stream's response headers and ends it.
func (b *testbed) respond(id uint32) {
	b.host.current = id
	b.vm.OnResponseHeaders(id, 2, false)
	b.vm.OnLog(id)
	if !b.vm.OnDone(id) {
		b.t.Fatal("OnDone returned false")
	}
	b.vm.OnDelete(id)
}

func header(hs [][2]string, name string) (string, bool) {
	for _, h := range hs {
		if h[0] == name {
			return h[1], true
		}
	}
	return "", false
}

// sharedData is proxy-wasm-cpp-host's shared data (src/shared_data.cc) of
// one vm_id, which the fake hosts of one test's VMs share: a CAS number
// from one counter per set; a set with CAS 0, or of a key with no value,
// always succeeds; another CAS than the key's is a mismatch.
type sharedData struct {
	m    map[string]sharedValue
	next uint32
	// alwaysMismatch makes every set with a CAS fail, as if another VM
	// always wrote first.
	alwaysMismatch bool
}

type sharedValue struct {
	v   []byte
	cas uint32
}

func newSharedData() *sharedData { return &sharedData{m: map[string]sharedValue{}} }

func (h *fakeHost) SharedData(key string) ([]byte, uint32, bool) {
	h.sharedGets++
	if strings.HasPrefix(key, "sluice.leases.") {
		h.leaseGets++
	}
	e, ok := h.shared.m[key]
	return e.v, e.cas, ok
}

func (h *fakeHost) SetSharedData(key string, value []byte, cas uint32) (bool, error) {
	d := h.shared
	if e, ok := d.m[key]; ok && cas != 0 && (cas != e.cas || d.alwaysMismatch) {
		return false, nil
	}
	d.next++
	d.m[strings.Clone(key)] = sharedValue{append([]byte(nil), value...), d.next}
	return true, nil
}
