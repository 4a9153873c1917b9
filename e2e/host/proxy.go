package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Proxy is an http.Handler that runs the Host's filter on every request, the
// way Envoy's HTTP connection manager runs a Wasm HTTP filter, and forwards
// what the filter lets through to one upstream with httputil.ReverseProxy:
//
//   - each request is assigned to a worker VM (round robin) and gets a stream
//     context; proxy_on_request_headers sees the request with ":authority",
//     ":path", ":method", ":scheme", "x-forwarded-proto" and "x-request-id"
//     (generated when absent), like Envoy's request header map;
//   - a paused request waits (up to Config.PauseTimeout) for
//     proxy_continue_stream or proxy_send_local_response;
//   - a continued request goes upstream with the headers as the filter left
//     them (added, replaced, removed; ":path", ":method", ":authority"
//     included); proxy_on_request_body sees the whole body when exported;
//   - proxy_on_response_headers (and proxy_on_response_body) see the upstream
//     response and their changes are applied before it is sent;
//   - local responses, and the host's own error responses, go through
//     proxy_on_response_headers too, as Envoy's local replies go through the
//     encoder filters; then proxy_on_log, proxy_on_done, proxy_on_delete.
type Proxy struct {
	host     *Host
	target   *url.URL // upstream base URL
	upstream string   // upstream.address
	rp       *httputil.ReverseProxy
}

// NewProxy returns a Proxy forwarding to upstream, a base URL such as
// "http://127.0.0.1:9000".
func NewProxy(h *Host, upstream string) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("host proxy: upstream %q is not an http(s)://host:port URL", upstream)
	}
	t := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // forward bodies as the upstream sent them
	}
	return newProxy(h, u, u.Host, t), nil
}

// NewHandlerProxy returns a Proxy whose upstream is an in-process handler:
// no sockets, for tests.
func NewHandlerProxy(h *Host, upstream http.Handler) *Proxy {
	u := &url.URL{Scheme: "http", Host: "upstream.invalid"}
	return newProxy(h, u, "", handlerTransport{upstream})
}

// newProxy wires the ReverseProxy hooks.
func newProxy(h *Host, target *url.URL, addr string, t http.RoundTripper) *Proxy {
	p := &Proxy{host: h, target: target, upstream: addr}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      t,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     &bufferPool{},
	}
	return p
}

// bufferPool recycles the ReverseProxy's copy buffers.
type bufferPool struct{ p sync.Pool }

// Get returns a 32 KiB buffer.
func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

// Put returns a buffer to the pool.
func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// forwardKey carries the forwardState through the ReverseProxy.
type forwardKey struct{}

// forwardState is what the ReverseProxy hooks need about one request.
type forwardState struct {
	st     *Stream       // nil when forwarding unfiltered (fail open)
	req    Headers       // request headers as the filter left them
	body   io.ReadCloser // body to send
	length int64         // its length, -1 when unknown
}

// errStreamReset makes the ErrorHandler abort the downstream connection.
var errStreamReset = errors.New("the filter reset the stream")

// replyError makes the ErrorHandler write reply as is.
type replyError struct {
	status int    // HTTP status
	body   string // text/plain body
}

// Error describes the reply.
func (e *replyError) Error() string { return fmt.Sprintf("%d %s", e.status, e.body) }

// ServeHTTP filters and forwards one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdrs := requestMap(r)
	hasBody := r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	vm := p.host.Pick()
	st, err := vm.NewStream(StreamInfo{
		RemoteAddr: r.RemoteAddr,
		LocalAddr:  localAddr(r),
		Protocol:   r.Proto,
	})
	if err != nil {
		if p.host.cfg.FailOpen {
			p.forward(w, r, &forwardState{req: hdrs, body: r.Body, length: r.ContentLength})
			return
		}
		writeRaw(w, http.StatusServiceUnavailable, nil)
		return
	}
	defer st.Finish()

	d := p.await(r.Context(), st, st.RequestHeaders(hdrs, !hasBody))
	if p.finishEarly(w, r, st, d) {
		return
	}
	fs := &forwardState{st: st, body: r.Body, length: r.ContentLength}
	if hasBody && vm.fns.requestBody != nil {
		b, err := readLimited(r.Body, p.host.maxBody())
		if err != nil {
			if errors.Is(err, errTooLarge) {
				p.writeLocal(w, r, st, &LocalResponse{Status: http.StatusRequestEntityTooLarge, Body: []byte("Payload Too Large"), Details: "request_payload_too_large"})
				return
			}
			panic(http.ErrAbortHandler)
		}
		d := p.await(r.Context(), st, st.RequestBody(b, true))
		if p.finishEarly(w, r, st, d) {
			return
		}
		b = st.RequestBodyBytes()
		fs.body, fs.length = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	fs.req = st.Request()
	if !hasBody {
		fs.body, fs.length = http.NoBody, 0
	}
	st.forwarded(p.upstream)
	p.forward(w, r, fs)
}

// forward hands the request to the ReverseProxy.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, fs *forwardState) {
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardKey{}, fs)))
}

// maxBody is the body buffering limit.
func (h *Host) maxBody() int64 {
	if h.cfg.MaxBodyBytes > 0 {
		return h.cfg.MaxBodyBytes
	}
	return defaultMaxBody
}

// await waits on a paused stream, bounded by Config.PauseTimeout.
func (p *Proxy) await(ctx context.Context, st *Stream, d Decision) Decision {
	if d.Kind != DecisionPause {
		return d
	}
	ctx, cancel := context.WithTimeout(ctx, p.host.cfg.PauseTimeout)
	defer cancel()
	return st.Await(ctx)
}

// finishEarly answers the request when the filter did not let it through;
// it reports whether it did.
func (p *Proxy) finishEarly(w http.ResponseWriter, r *http.Request, st *Stream, d Decision) bool {
	switch d.Kind {
	case DecisionContinue:
		return false
	case DecisionLocalResponse:
		p.writeLocal(w, r, st, d.Local)
	case DecisionReset:
		panic(http.ErrAbortHandler)
	case DecisionFailed:
		if p.host.cfg.FailOpen {
			return false
		}
		writeRaw(w, http.StatusServiceUnavailable, nil)
	case DecisionTimeout:
		p.writeLocal(w, r, st, &LocalResponse{Status: http.StatusRequestTimeout, Body: []byte("stream timeout"), Details: "stream_idle_timeout"})
	default:
		writeRaw(w, http.StatusInternalServerError, []byte("unexpected filter decision "+d.Kind.String()))
	}
	return true
}

// writeLocal sends a local reply through proxy_on_response_headers (and
// proxy_on_response_body), like Envoy's sendLocalReply.
func (p *Proxy) writeLocal(w http.ResponseWriter, r *http.Request, st *Stream, lr *LocalResponse) {
	d := p.await(r.Context(), st, st.ResponseHeaders(LocalReplyHeaders(lr), len(lr.Body) == 0))
	hdrs, body := st.Response(), lr.Body
	switch d.Kind {
	case DecisionReset:
		panic(http.ErrAbortHandler)
	case DecisionLocalResponse:
		hdrs, body = LocalReplyHeaders(d.Local), d.Local.Body
	case DecisionFailed, DecisionTimeout:
		// Send the reply as built: the filter is gone or stuck.
		hdrs = LocalReplyHeaders(lr)
	case DecisionContinue:
		if len(body) > 0 && st.vm.fns.responseBody != nil {
			bd := p.await(r.Context(), st, st.ResponseBody(body, true))
			if bd.Kind == DecisionContinue {
				body = st.ResponseBodyBytes()
			}
		}
	}
	writeMap(w, hdrs, body)
}

// rewrite builds the upstream request from the filtered headers.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	fs := pr.In.Context().Value(forwardKey{}).(*forwardState)
	out := pr.Out
	out.URL.Scheme, out.URL.Host = p.target.Scheme, p.target.Host
	if m, ok := fs.req.Get(":method"); ok && m != "" {
		out.Method = m
	}
	if a, ok := fs.req.Get(":authority"); ok {
		out.Host = a
	}
	if path, ok := fs.req.Get(":path"); ok {
		if u, err := url.ParseRequestURI(path); err == nil {
			out.URL.Path, out.URL.RawPath, out.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
			out.URL.Path = singleJoin(p.target.Path, out.URL.Path)
		}
	}
	out.Header = make(http.Header, len(fs.req))
	for _, kv := range fs.req {
		if strings.HasPrefix(kv[0], ":") || kv[0] == "content-length" || hopHeaders[kv[0]] {
			continue
		}
		out.Header.Add(kv[0], kv[1])
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = nil // no Go default
	}
	out.Body, out.ContentLength = fs.body, fs.length
	if fs.length == 0 {
		out.Body = http.NoBody
	}
}

// singleJoin joins a base path and a request path with one slash.
func singleJoin(base, path string) string {
	if base == "" || base == "/" {
		return path
	}
	return strings.TrimSuffix(base, "/") + "/" + strings.TrimPrefix(path, "/")
}

// modifyResponse runs the response callbacks on the upstream response.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	fs := resp.Request.Context().Value(forwardKey{}).(*forwardState)
	st := fs.st
	if st == nil {
		return nil
	}
	ctx := resp.Request.Context()
	eos := resp.ContentLength == 0 || resp.Body == http.NoBody
	d := p.await(ctx, st, st.ResponseHeaders(responseMap(resp.StatusCode, resp.Header), eos))
	switch d.Kind {
	case DecisionContinue:
	case DecisionLocalResponse:
		resp.Body.Close()
		setResponse(resp, LocalReplyHeaders(d.Local), d.Local.Body)
		return nil
	case DecisionReset:
		return errStreamReset
	case DecisionFailed:
		if p.host.cfg.FailOpen {
			return nil
		}
		return &replyError{status: http.StatusServiceUnavailable}
	default:
		return &replyError{status: http.StatusRequestTimeout, body: "stream timeout"}
	}
	h := st.Response()
	if eos || st.vm.fns.responseBody == nil {
		return applyHeaders(resp, h)
	}
	b, err := readLimited(resp.Body, p.host.maxBody())
	resp.Body.Close()
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return &replyError{status: http.StatusInternalServerError, body: "response body too large to buffer for the filter"}
		}
		return errStreamReset
	}
	bd := p.await(ctx, st, st.ResponseBody(b, true))
	switch bd.Kind {
	case DecisionContinue:
		b = st.ResponseBodyBytes()
	case DecisionLocalResponse:
		setResponse(resp, LocalReplyHeaders(bd.Local), bd.Local.Body)
		return nil
	case DecisionReset:
		return errStreamReset
	}
	if err := applyHeaders(resp, h); err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Del("Transfer-Encoding")
	resp.TransferEncoding = nil
	return nil
}

// errorHandler answers when the upstream could not be reached, or a hook
// asked for a specific reply.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	fs := r.Context().Value(forwardKey{}).(*forwardState)
	var re *replyError
	switch {
	case errors.Is(err, errStreamReset):
		panic(http.ErrAbortHandler)
	case errors.As(err, &re):
		writeRaw(w, re.status, []byte(re.body))
	case fs.st == nil:
		writeRaw(w, http.StatusServiceUnavailable, []byte("upstream connect error or disconnect/reset before headers. reset reason: "+err.Error()))
	default:
		p.writeLocal(w, r, fs.st, &LocalResponse{
			Status:  http.StatusServiceUnavailable,
			Body:    []byte("upstream connect error or disconnect/reset before headers. reset reason: connection failure, transport failure reason: " + err.Error()),
			Details: "upstream_reset_before_response_started",
		})
	}
}

// setResponse replaces resp with a local reply.
func setResponse(resp *http.Response, h Headers, body []byte) {
	_ = applyHeaders(resp, h)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.TransferEncoding = nil
}

// applyHeaders makes resp's status and headers those of h.
func applyHeaders(resp *http.Response, h Headers) error {
	if s, ok := h.Get(":status"); ok {
		code, err := strconv.Atoi(s)
		if err != nil || code < 100 || code > 999 {
			return &replyError{status: http.StatusBadGateway, body: fmt.Sprintf("the filter set an invalid :status %q", s)}
		}
		resp.StatusCode = code
		resp.Status = fmt.Sprintf("%d %s", code, http.StatusText(code))
	}
	resp.Header = make(http.Header, len(h))
	for _, kv := range h {
		if !strings.HasPrefix(kv[0], ":") {
			resp.Header.Add(kv[0], kv[1])
		}
	}
	return nil
}

// writeMap writes a response given as a header map and a body.
func writeMap(w http.ResponseWriter, h Headers, body []byte) {
	code := http.StatusOK
	if s, ok := h.Get(":status"); ok {
		if c, err := strconv.Atoi(s); err == nil && c >= 100 && c <= 999 {
			code = c
		}
	}
	wh := w.Header()
	for _, kv := range h {
		if !strings.HasPrefix(kv[0], ":") && kv[0] != "content-length" {
			wh.Add(kv[0], kv[1])
		}
	}
	wh.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// writeRaw writes a reply without the filter, like Envoy's 503 for a failed
// VM (empty body).
func writeRaw(w http.ResponseWriter, code int, body []byte) {
	if len(body) > 0 {
		w.Header().Set("Content-Type", "text/plain")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// errTooLarge is returned by readLimited past its limit.
var errTooLarge = errors.New("body too large")

// readLimited reads all of r, up to limit bytes.
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}

// hopHeaders are connection-specific headers Envoy does not pass to filters
// or upstreams.
var hopHeaders = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "te": true, "host": true,
}

// requestMap builds the request header map a filter sees: pseudo-headers,
// then the request's headers (lower case, sorted, one entry per value)
// without connection-specific ones, then x-forwarded-proto and x-request-id
// when absent, as Envoy's connection manager adds them.
func requestMap(r *http.Request) Headers {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	path := r.RequestURI
	if path == "" || !strings.HasPrefix(path, "/") {
		path = r.URL.RequestURI()
	}
	h := Headers{{":authority", r.Host}, {":path", path}, {":method", r.Method}, {":scheme", scheme}}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopHeaders[lk] {
			continue
		}
		for _, v := range r.Header[k] {
			h = append(h, [2]string{lk, v})
		}
	}
	if _, ok := h.Get("x-forwarded-proto"); !ok {
		h = append(h, [2]string{"x-forwarded-proto", scheme})
	}
	if _, ok := h.Get("x-request-id"); !ok {
		h = append(h, [2]string{"x-request-id", newUUID()})
	}
	return h
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// localAddr is the address the request came in on, when the server says.
func localAddr(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return ""
}

// handlerTransport is an http.RoundTripper that serves requests with an
// in-process handler.
type handlerTransport struct{ h http.Handler }

// RoundTrip runs the handler on a server-side copy of req.
func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	if in.Body == nil {
		in.Body = http.NoBody
	}
	if in.RemoteAddr == "" {
		in.RemoteAddr = "127.0.0.1:0"
	}
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, in)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
