package host

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
)

// CallFailureMode chooses how a proxy_http_call that got no real response is
// reported to proxy_on_http_call_response.
type CallFailureMode int

// CallFailureMode values.
const (
	// CallFailureEnvoy reports failures as Envoy does. Envoy's async HTTP
	// client runs the router, whose local replies become the call's response:
	// a timeout before the response headers is a 504 with body "upstream
	// request timeout", a connection failure a 503 "upstream connect error or
	// disconnect/reset before headers. reset reason: ..."; for a gRPC request
	// (content-type application/grpc) the router answers gRPC-style instead:
	// ":status: 200", "grpc-status: 14" (UNAVAILABLE), the text in
	// "grpc-message", no body. Only a failure after the response headers (a
	// reset, a timeout mid-body, a body over the buffer limit) reaches
	// proxy_on_http_call_response with 0 headers, 0 body and 0 trailers
	// (proxy_get_status: BROKEN_CONNECTION, "reset").
	CallFailureEnvoy CallFailureMode = iota
	// CallFailureEmpty reports every failure, timeouts included, with 0
	// headers, 0 body and 0 trailers, the specification's "If num_headers is
	// 0, then the HTTP call failed"; Kong's ngx_wasm_module behaves this way.
	CallFailureEmpty
)

// String names the mode: "envoy" or "empty".
func (m CallFailureMode) String() string {
	switch m {
	case CallFailureEnvoy:
		return "envoy"
	case CallFailureEmpty:
		return "empty"
	}
	return "CallFailureMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseCallFailureMode turns "envoy" or "empty" into a CallFailureMode.
func ParseCallFailureMode(s string) (CallFailureMode, error) {
	switch s {
	case "envoy", "":
		return CallFailureEnvoy, nil
	case "empty":
		return CallFailureEmpty, nil
	}
	return 0, fmt.Errorf("call failure mode %q: want envoy or empty", s)
}

// callResponse is what proxy_on_http_call_response can read.
type callResponse struct {
	headers  Headers    // HTTP_CALL_RESPONSE_HEADERS, ":status" first
	trailers Headers    // HTTP_CALL_RESPONSE_TRAILERS
	body     []byte     // HTTP_CALL_RESPONSE_BODY
	status   callStatus // proxy_get_status
}

// caller sends proxy_http_call requests over HTTP/2 cleartext (prior
// knowledge, like an Envoy cluster with http2_protocol_options).
type caller struct {
	clusters  map[string]string // cluster name -> host:port
	transport *http2.Transport  // h2c, pooled per address
	client    *http.Client      // no redirects
	maxBody   int64             // response body limit
	mode      CallFailureMode   // failure reporting
}

// newCaller builds the h2c client.
func newCaller(clusters map[string]string, maxBody int64, mode CallFailureMode) *caller {
	t := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		ReadIdleTimeout: 30 * time.Second,
		PingTimeout:     5 * time.Second,
	}
	cl := make(map[string]string, len(clusters))
	for k, v := range clusters {
		cl[k] = v
	}
	return &caller{
		clusters:  cl,
		transport: t,
		client: &http.Client{
			Transport:     t,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		maxBody: maxBody,
		mode:    mode,
	}
}

// close drops idle connections.
func (c *caller) close() { c.transport.CloseIdleConnections() }

// connectionHeaders are never sent on HTTP/2 (Go's transport refuses them).
var connectionHeaders = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "host": true, "content-length": true,
}

// startHTTPCall validates a proxy_http_call and sends it in the background;
// the response is delivered to this VM's root context. vm.mu is held.
func (vm *VM) startHTTPCall(cluster string, headers Headers, body []byte, trailers Headers, timeout time.Duration) (uint32, Status) {
	h := vm.host
	addr, ok := h.calls.clusters[cluster]
	if !ok {
		vm.log(LogWarn, fmt.Sprintf("proxy_http_call: unknown cluster %q", cluster))
		return 0, StatusBadArgument
	}
	for i := range headers {
		headers[i][0] = strings.ToLower(headers[i][0])
	}
	for i := range trailers {
		trailers[i][0] = strings.ToLower(trailers[i][0])
	}
	for _, k := range []string{":method", ":path", ":authority"} {
		if v, ok := headers.Get(k); !ok || v == "" {
			vm.log(LogWarn, fmt.Sprintf("proxy_http_call to %q: missing %s", cluster, k))
			return 0, StatusBadArgument
		}
	}
	for {
		vm.nextToken++
		if _, used := vm.calls[vm.nextToken]; !used && vm.nextToken != 0 {
			break
		}
	}
	token := vm.nextToken
	vm.calls[token] = struct{}{}
	started := h.goTracked(func() {
		resp := h.calls.do(h.ctx, addr, headers, body, trailers, timeout)
		vm.deliverCall(token, resp)
	})
	if !started {
		delete(vm.calls, token)
		return 0, StatusInternalFailure
	}
	return token, StatusOK
}

// deliverCall runs proxy_on_http_call_response on the root context of the VM
// that made the call, serialized with everything else on that VM. Responses
// that arrive after the host started closing are dropped, as Envoy cancels
// them.
func (vm *VM) deliverCall(token uint32, resp *callResponse) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	delete(vm.calls, token)
	if vm.failed != nil || vm.closed || vm.host.ctx.Err() != nil || vm.fns.httpCallResponse == nil {
		return
	}
	vm.callResp, vm.status = resp, resp.status
	_, _ = vm.callContext(nil, vm.fns.httpCallResponse, uint64(vm.rootID), uint64(token),
		uint64(len(resp.headers)), uint64(len(resp.body)), uint64(len(resp.trailers)))
	vm.callResp, vm.status = nil, callStatus{}
}

// notifyQueue runs proxy_on_queue_ready on this VM's root context, after the
// call that enqueued returns.
func (vm *VM) notifyQueue(token uint32) {
	h := vm.host
	h.goTracked(func() {
		vm.mu.Lock()
		defer vm.mu.Unlock()
		if vm.failed != nil || vm.closed || h.ctx.Err() != nil || vm.fns.queueReady == nil {
			return
		}
		_, _ = vm.callContext(nil, vm.fns.queueReady, uint64(vm.rootID), uint64(token))
	})
}

// failureKind classifies a call that got no complete response.
type failureKind int

// failureKind values.
const (
	failTimeout failureKind = iota // deadline before the response headers
	failConnect                    // no response headers: connect error, refused stream, reset
	failReset                      // after the response headers: reset, deadline, limit
)

// do sends one call and returns what to deliver.
func (c *caller) do(parent context.Context, addr string, headers Headers, body []byte, trailers Headers, timeout time.Duration) *callResponse {
	ctx := parent
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(parent, timeout)
		defer cancel()
	}
	method, _ := headers.Get(":method")
	path, _ := headers.Get(":path")
	authority, _ := headers.Get(":authority")
	ct, _ := headers.Get("content-type")
	isGRPC := strings.HasPrefix(ct, "application/grpc")

	var rb io.Reader = http.NoBody
	if len(body) > 0 {
		rb = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rb)
	if err != nil {
		return c.failure(failConnect, isGRPC, err.Error())
	}
	req.Host = authority
	for _, p := range headers {
		if strings.HasPrefix(p[0], ":") || connectionHeaders[p[0]] || (p[0] == "te" && p[1] != "trailers") {
			continue
		}
		req.Header.Add(p[0], p[1])
	}
	req.ContentLength = int64(len(body))
	if len(trailers) > 0 {
		req.Trailer = make(http.Header, len(trailers))
		for _, p := range trailers {
			req.Trailer.Add(p[0], p[1])
		}
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return c.failure(failTimeout, isGRPC, "")
		}
		return c.failure(failConnect, isGRPC, err.Error())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil || int64(len(b)) > c.maxBody {
		return c.failure(failReset, isGRPC, "")
	}
	out := &callResponse{headers: responseMap(resp.StatusCode, resp.Header), body: b}
	out.trailers = headerPairs(resp.Trailer)
	return out
}

// failure builds the response delivered for a failed call.
func (c *caller) failure(kind failureKind, isGRPC bool, detail string) *callResponse {
	if c.mode == CallFailureEmpty || kind == failReset {
		return &callResponse{status: callStatus{code: uint32(StatusBrokenConnection), message: "reset"}}
	}
	if kind == failTimeout {
		return routerLocalReply(http.StatusGatewayTimeout, "upstream request timeout", isGRPC)
	}
	msg := "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
	if detail != "" {
		msg += ", transport failure reason: " + detail
	}
	return routerLocalReply(http.StatusServiceUnavailable, msg, isGRPC)
}

// routerLocalReply is the response Envoy's router produces for an async
// client request that failed before its response headers.
func routerLocalReply(code int, text string, isGRPC bool) *callResponse {
	if isGRPC {
		return &callResponse{headers: Headers{
			{":status", "200"},
			{"content-type", "application/grpc"},
			{"grpc-status", strconv.Itoa(grpcStatusForHTTP(code))},
			{"grpc-message", text},
		}}
	}
	return &callResponse{
		headers: Headers{
			{":status", strconv.Itoa(code)},
			{"content-length", strconv.Itoa(len(text))},
			{"content-type", "text/plain"},
		},
		body: []byte(text),
	}
}

// grpcStatusForHTTP maps an HTTP status to a gRPC status as Envoy's
// Grpc::Utility::httpToGrpcStatus does.
func grpcStatusForHTTP(code int) int {
	switch code {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}

// responseMap is a response's header map: ":status" then every header, lower
// case, keys sorted, one entry per value.
func responseMap(status int, h http.Header) Headers {
	return append(Headers{{":status", strconv.Itoa(status)}}, headerPairs(h)...)
}

// headerPairs flattens an http.Header into sorted lower-case pairs.
func headerPairs(h http.Header) Headers {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out Headers
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range h[k] {
			out = append(out, [2]string{lk, v})
		}
	}
	return out
}
