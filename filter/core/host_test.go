package core

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/filter/core/headermap"
	"github.com/sluicehq/sluice/filter/core/lease"
	"github.com/sluicehq/sluice/filter/core/rlsproto"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// fakeHost is a host for the core's tests, with an injected clock: it
// serves request headers per stream, records what the worker does, and
// delivers answers to calls. Its per-Envoy state is the proxy-wasm host's
// (package shareddata) on a shared data of its own, which the fake hosts
// of one test's workers share.
type fakeHost struct {
	t          testing.TB
	now        int64
	config     []byte
	quiet      bool // record nothing that allocates (for the allocation test)
	leaseSlots int  // the lease pools' slots (0: shareddata.LeaseSlots)

	headers map[uint32]map[string]string // request headers per stream; a stream without is gone
	remote  map[uint32]string
	// Per stream: response headers, response trailers, dynamic metadata
	// (by its proxy-wasm property path).
	respHeaders  map[uint32]map[string]string
	respTrailers map[uint32]map[string]string
	props        map[uint32]map[string][]byte
	propReads    int
	// Per stream: the request body received so far and whether the
	// request ended with its headers; the response chunk being delivered,
	// what the client got of the response body, and whether the response
	// was ended early.
	reqBody    map[uint32][]byte
	noBody     map[uint32]bool
	chunk      map[uint32][]byte
	client     map[uint32][]byte
	endedEarly map[uint32]bool
	canEnd     bool // the host can end a response early (EndResponse)

	calls     []fakeCall
	nextCall  uint32
	callErr   error
	settleErr error // fails the settle calls only

	local    map[uint32]fakeLocal
	resumed  map[uint32]int
	order    []uint32 // streams in the order they were resumed
	addedReq map[uint32][][2]string
	addedRsp map[uint32][][2]string
	logs     []string
	counters map[string]int64
	names    []string // counter names by id-1
	tick     uint32   // the tick period, in ms, as a proxy-wasm host would set it
	tickSets int      // changes of the tick period
	locals   int      // local responses sent (also when quiet)

	panicOnHeader bool
	panicOnShared bool // reading the shared data panics

	shared     *sharedData // the proxy's shared data: the same for the workers of a test
	sharedGets int
	leaseGets  int      // the reads of the lease pools' keys
	leaseKeys  []string // and the keys read, in order
}

type fakeCall struct {
	id      uint32
	stream  uint32
	cluster string
	headers [][2]string
	body    []byte // the frame; the bare message of a gRPC call
	timeout uint32
	service []byte // the GrpcService of a gRPC call; nil over HTTP
}

// fakeAnswer is a call's response as an HTTP call delivers it.
type fakeAnswer struct {
	headers  map[string]string
	trailers map[string]string
	body     []byte
}

func (a *fakeAnswer) Header(name string) (string, bool) {
	v, ok := a.headers[name]
	return v, ok
}

func (a *fakeAnswer) Trailer(name string) (string, bool) {
	v, ok := a.trailers[name]
	return v, ok
}

func (a *fakeAnswer) Body(size int) ([]byte, error) { return a.body, nil }

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
		props: map[uint32]map[string][]byte{}, reqBody: map[uint32][]byte{}, noBody: map[uint32]bool{},
		chunk: map[uint32][]byte{}, client: map[uint32][]byte{}, endedEarly: map[uint32]bool{},
	}
}

// wallBase is the fake host's wall clock at its monotonic 0.
const wallBase = int64(1_800_000_000) * 1e9

func (h *fakeHost) Now() int64 { return h.now }

// WallNow gives the fake host a wall clock that moves with its monotonic
// one.
func (h *fakeHost) WallNow() int64 { return wallBase + h.now }

func (h *fakeHost) Log(level Level, msg string) {
	h.logs = append(h.logs, []string{"trace", "debug", "info", "warn", "error", "critical"}[level]+": "+msg)
}

func (h *fakeHost) DefineMetric(kind MetricKind, name string) (uint32, error) {
	for i, n := range h.names {
		if n == name {
			return uint32(i + 1), nil
		}
	}
	h.names = append(h.names, name)
	return uint32(len(h.names)), nil
}

func (h *fakeHost) IncrementMetric(id uint32, delta int64) {
	h.counters[h.names[id-1]] += delta
}

func (h *fakeHost) Call(from Stream, c *Call) (uint32, error) {
	if h.callErr != nil {
		return 0, h.callErr
	}
	if h.settleErr != nil && strings.Contains(string(c.Headers), rlsproto.SettleHeader) {
		return 0, h.settleErr
	}
	h.nextCall++
	fc := fakeCall{id: h.nextCall, cluster: c.Cluster, timeout: c.TimeoutMs}
	if s, ok := from.(*fakeStream); ok {
		fc.stream = s.id
	}
	if c.GRPCService != nil {
		fc.body = append([]byte(nil), c.Frame[rlsproto.FrameHeaderLen:]...)
		fc.service = append([]byte(nil), c.GRPCService...)
	} else {
		fc.body = append([]byte(nil), c.Frame...)
		fc.headers = h.parse(c.Headers)
	}
	h.calls = append(h.calls, fc)
	return h.nextCall, nil
}

// Schedule sets the tick period as the proxy-wasm host does: the delay in
// whole milliseconds, from 1 to 1000, set when it changes.
func (h *fakeHost) Schedule(delay int64) {
	ms := uint32(max(1, min(1000, (delay+999_999)/1_000_000)))
	if ms != h.tick {
		h.tick = ms
		h.tickSets++
	}
}

func (h *fakeHost) Blocks(domain string) Blocks {
	return shareddata.New(h, domain, shareddata.Slots)
}

func (h *fakeHost) Pools(domain string, perWorker bool) lease.Pools {
	var d shareddata.Data = h
	if perWorker {
		d = shareddata.NewLocal()
	}
	slots := shareddata.LeaseSlots
	if h.leaseSlots != 0 {
		slots = h.leaseSlots
	}
	return shareddata.NewLeases(d, domain, slots)
}

// parse deserializes a header map, copying the strings.
func (h *fakeHost) parse(data []byte) [][2]string {
	pairs, err := headermap.Parse(nil, append([]byte(nil), data...))
	if err != nil {
		h.t.Errorf("malformed header map: %v", err)
	}
	return pairs
}

func (h *fakeHost) logged(part string) bool {
	for _, l := range h.logs {
		if strings.Contains(l, part) {
			return true
		}
	}
	return false
}

// errGone is what a fake stream's actions return once the stream is gone
// (its request headers deleted).
var errGone = errors.New("BAD_ARGUMENT")

// fakeStream is a stream of a fakeHost.
type fakeStream struct {
	h  *fakeHost
	id uint32
}

func (s *fakeStream) gone() bool {
	_, ok := s.h.headers[s.id]
	return !ok
}

func (s *fakeStream) RequestHeader(name string) (string, bool) {
	if s.h.panicOnHeader {
		panic("injected failure")
	}
	v, ok := s.h.headers[s.id][name]
	return v, ok
}

func (s *fakeStream) RemoteAddress() (string, bool) {
	v, ok := s.h.remote[s.id]
	return v, ok
}

func (s *fakeStream) ResponseHeader(name string) (string, bool) {
	v, ok := s.h.respHeaders[s.id][name]
	return v, ok
}

func (s *fakeStream) ResponseTrailer(name string) (string, bool) {
	v, ok := s.h.respTrailers[s.id][name]
	return v, ok
}

func (s *fakeStream) DynamicMetadata(namespace, key string) ([]byte, bool) {
	s.h.propReads++
	v, ok := s.h.props[s.id]["metadata\x00filter_metadata\x00"+namespace+"\x00"+key]
	return v, ok
}

func (s *fakeStream) RequestEnded() bool { return s.h.noBody[s.id] }

func (s *fakeStream) RequestBody(start, max int) ([]byte, error) {
	return bodyRange(s.h.reqBody[s.id], start, max), nil
}

func (s *fakeStream) ResponseBody(start, max int) ([]byte, error) {
	return bodyRange(s.h.chunk[s.id], start, max), nil
}

// bodyRange is b[start:start+max], within b.
func bodyRange(b []byte, start, max int) []byte {
	if start >= len(b) {
		return nil
	}
	return b[start:min(len(b), start+max)]
}

func (s *fakeStream) SetResponseBody(data []byte) error {
	s.h.chunk[s.id] = append([]byte(nil), data...)
	return nil
}

func (s *fakeStream) EndResponse() bool {
	if s.h.canEnd {
		s.h.endedEarly[s.id] = true
	}
	return s.h.canEnd
}

func (s *fakeStream) AddRequestHeader(name, value string) error {
	if s.gone() {
		return errGone
	}
	s.h.addedReq[s.id] = append(s.h.addedReq[s.id], [2]string{name, value})
	return nil
}

func (s *fakeStream) AddResponseHeader(name, value string) error {
	s.h.addedRsp[s.id] = append(s.h.addedRsp[s.id], [2]string{name, value})
	return nil
}

func (s *fakeStream) Resume() error {
	if s.gone() {
		return errGone
	}
	s.h.resumed[s.id]++
	s.h.order = append(s.h.order, s.id)
	return nil
}

func (s *fakeStream) SendLocalReply(status uint32, details string, body, headers []byte) error {
	h := s.h
	h.locals++
	if h.quiet {
		return nil
	}
	if s.gone() {
		return errGone
	}
	if _, dup := h.local[s.id]; dup {
		h.t.Errorf("second local response for stream %d", s.id)
	}
	h.local[s.id] = fakeLocal{status, details, string(body), h.parse(headers)}
	return nil
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

func header(hs [][2]string, name string) (string, bool) {
	for _, h := range hs {
		if h[0] == name {
			return h[1], true
		}
	}
	return "", false
}

// sharedData is proxy-wasm-cpp-host's shared data (src/shared_data.cc) of
// one vm_id, which the fake hosts of one test's workers share: a CAS number
// from one counter per set; a set with CAS 0, or of a key with no value,
// always succeeds; another CAS than the key's is a mismatch.
type sharedData struct {
	m    map[string]sharedValue
	next uint32
	// alwaysMismatch makes every set with a CAS fail, as if another worker
	// always wrote first.
	alwaysMismatch bool
}

type sharedValue struct {
	v   []byte
	cas uint32
}

func newSharedData() *sharedData { return &sharedData{m: map[string]sharedValue{}} }

func (h *fakeHost) SharedData(key string) ([]byte, uint32, bool) {
	if h.panicOnShared {
		panic("injected failure")
	}
	h.sharedGets++
	if strings.HasPrefix(key, "sluice.leases.") {
		h.leaseGets++
		h.leaseKeys = append(h.leaseKeys, strings.Clone(key)) // key may alias the caller's buffer
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

// tickPeriodMs is the fake host's idle tick period, in ms.
const tickPeriodMs = 1000

// testbed drives one worker through its hooks, as a host would, with the
// host's stream ids.
type testbed struct {
	t       testing.TB
	host    *fakeHost
	w       *Worker
	streams map[uint32]*Exchange // the open streams
	next    uint32
}

func newTestbed(t testing.TB, config string) *testbed {
	return newTestbedOn(t, config, newSharedData())
}

// newTestbedOn is newTestbed for a worker of a proxy whose shared data is
// d.
func newTestbedOn(t testing.TB, config string, d *sharedData) *testbed {
	return newTestbedSlots(t, config, d, 0)
}

// newTestbedSlots is newTestbedOn with lease pools of slots slots (0: the
// default).
func newTestbedSlots(t testing.TB, config string, d *sharedData, slots int) *testbed {
	h := newFakeHost(t, config)
	h.shared, h.leaseSlots = d, slots
	w := NewWorker(h)
	if !w.Configure([]byte(config)) {
		t.Fatalf("configuration refused: %v", h.logs)
	}
	return &testbed{t: t, host: h, w: w, streams: map[uint32]*Exchange{}, next: 100}
}

// open begins stream id.
func (b *testbed) open(id uint32) *Exchange {
	x := b.w.Open(&fakeStream{h: b.host, id: id})
	b.streams[id] = x
	return x
}

// requestHeaders runs stream id's request headers, recovering from a
// panic as a host does.
func (b *testbed) requestHeaders(id uint32) (action Action) {
	x := b.streams[id]
	defer func() {
		if r := recover(); r != nil {
			action = b.w.Recover(x, r)
		}
	}()
	return b.w.RequestHeaders(x)
}

// request creates a stream and runs its request headers.
func (b *testbed) request(headers map[string]string, remote string) (id uint32, action Action) {
	b.next++
	id = b.next
	b.host.headers[id] = headers
	if remote != "" {
		b.host.remote[id] = remote
	}
	b.open(id)
	return id, b.requestHeaders(id)
}

// lastCall returns the last call made.
func (b *testbed) lastCall() fakeCall {
	b.t.Helper()
	if len(b.host.calls) == 0 {
		b.t.Fatal("no call to answer")
	}
	return b.host.calls[len(b.host.calls)-1]
}

// deliver delivers an answer to the last call; nil: the call got none.
func (b *testbed) deliver(a *fakeAnswer) {
	b.t.Helper()
	b.answerCall(b.lastCall().id, a)
}

// answerCall delivers a to call id, as an HTTP call's answer.
func (b *testbed) answerCall(id uint32, a *fakeAnswer) {
	answer := rlsproto.NoAnswer()
	if a != nil {
		answer = rlsproto.ReadHTTPAnswer(a, len(a.body))
	}
	b.w.Answer(id, &answer)
}

// responseHeaders runs stream id's response headers.
func (b *testbed) responseHeaders(id uint32, end bool) {
	if x := b.streams[id]; x != nil {
		b.w.ResponseHeaders(x, end)
	}
}

// responseBody runs a chunk of stream id's response body.
func (b *testbed) responseBody(id uint32, size int, end bool) {
	if x := b.streams[id]; x != nil {
		b.w.ResponseBody(x, size, end)
	}
}

// responseTrailers runs stream id's response trailers.
func (b *testbed) responseTrailers(id uint32) {
	if x := b.streams[id]; x != nil {
		b.w.ResponseTrailers(x)
	}
}

// ended tells the worker that stream id ended.
func (b *testbed) ended(id uint32) {
	if x := b.streams[id]; x != nil {
		b.w.End(x)
	}
}

// close closes stream id.
func (b *testbed) close(id uint32) {
	if x := b.streams[id]; x != nil {
		delete(b.streams, id)
		b.w.Close(x)
	}
}

// respond runs a stream's response headers and ends it.
func (b *testbed) respond(id uint32) {
	b.responseHeaders(id, false)
	b.ended(id)
	b.ended(id)
	b.close(id)
}

// runTick runs the worker's tick.
func (b *testbed) runTick() { b.w.Tick() }

// sentRequest decodes the framed RateLimitRequest of a call's body.
func sentRequest(t testing.TB, body []byte) *rlsv3.RateLimitRequest {
	t.Helper()
	msg, err := rlsproto.ParseFrame(body)
	if err != nil {
		t.Fatal(err)
	}
	var req rlsv3.RateLimitRequest
	if err := proto.Unmarshal(msg, &req); err != nil {
		t.Fatal(err)
	}
	return &req
}

// asksQuota reports whether req carries rlsproto.QuotaField: its caller
// spends quotas, and names itself.
func asksQuota(req *rlsv3.RateLimitRequest) bool {
	num, typ, n := protowire.ConsumeTag(req.ProtoReflect().GetUnknown())
	return n > 0 && num == rlsproto.QuotaField && typ == protowire.VarintType
}
