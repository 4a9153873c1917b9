//go:build wasip1

// Command guest is a small proxy-wasm filter for the host's tests. It is
// independent of sluice's filter: its behaviour is chosen by the request
// path, so each test exercises one part of the ABI.
//
// Plugin configuration: "key=value" lines; keys cluster, authority,
// timeout_ms, tick_ms, delay_done (the root context then finishes its
// shutdown from the next tick, with proxy_done). A key containing "bad" is
// rejected.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
)

func main() {}

// config is the parsed plugin configuration.
var config struct {
	cluster   string // proxy_http_call target
	authority string // :authority of calls
	timeoutMs uint32 // call timeout
	delayDone bool   // root proxy_on_done returns false
}

// rootDonePending is set when the root context delayed its shutdown.
var rootDonePending bool

// queueToken is the shared queue registered at configure time.
var queueToken uint32

// Metric ids.
var (
	mRequests, mTicks, mLogs, mDeletes, mGauge, mHist, mQueue, mRootDone uint32
)

// stream is per-request state.
type stream struct {
	path string
}

var (
	streams = map[uint32]*stream{}
	calls   = map[uint32]uint32{} // token -> stream context id
	saved   uint32                // CAS remembered by /cas-get
)

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent != 0 {
		streams[id] = &stream{}
	}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) bool {
	b, _ := buffer(bufferVMConfig)
	if strings.Contains(string(b), "refuse") {
		logf(logError, "vm configuration: refused on request")
		return false
	}
	return true
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) bool {
	b, st := buffer(bufferPluginConfig)
	if st != statusOK || uint32(len(b)) != size {
		logf(logError, "plugin configuration: unreadable (status "+strconv.Itoa(int(st))+")")
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		switch {
		case strings.Contains(k, "bad"):
			logf(logError, "plugin configuration: field \""+k+"\": not allowed")
			return false
		case k == "cluster":
			config.cluster = v
		case k == "authority":
			config.authority = v
		case k == "timeout_ms":
			n, err := strconv.Atoi(v)
			if err != nil {
				logf(logError, "plugin configuration: field \"timeout_ms\": "+err.Error())
				return false
			}
			config.timeoutMs = uint32(n)
		case k == "delay_done":
			config.delayDone = v == "1"
		case k == "tick_ms":
			n, err := strconv.Atoi(v)
			if err != nil {
				logf(logError, "plugin configuration: field \"tick_ms\": "+err.Error())
				return false
			}
			proxySetTickPeriod(uint32(n))
		default:
			logf(logError, "plugin configuration: unknown field \""+k+"\"")
			return false
		}
	}
	proxyDefineMetric(metricCounter, "guest_requests", &mRequests)
	proxyDefineMetric(metricCounter, "guest_ticks", &mTicks)
	proxyDefineMetric(metricCounter, "guest_logs", &mLogs)
	proxyDefineMetric(metricCounter, "guest_deletes", &mDeletes)
	proxyDefineMetric(metricGauge, "guest_gauge", &mGauge)
	proxyDefineMetric(metricHistogram, "guest_hist", &mHist)
	proxyDefineMetric(metricCounter, "guest_queue_ready", &mQueue)
	proxyDefineMetric(metricCounter, "guest_root_done", &mRootDone)
	proxyRegisterSharedQueue("guest-queue", &queueToken)
	logf(logInfo, "configured")
	return true
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	proxyIncrementMetric(mTicks, 1)
	if rootDonePending {
		rootDonePending = false
		if proxyDone() == statusOK {
			proxyIncrementMetric(mRootDone, 1)
		}
	}
}

//go:wasmexport proxy_on_queue_ready
func onQueueReady(root, token uint32) {
	for proxyDequeueSharedQueue(token, &retData, &retSize) == statusOK {
		proxySetSharedData("queue-last", string(take(retData, retSize)), 0)
		proxyIncrementMetric(mQueue, 1)
	}
}

// addRequestHeader adds a request header with a decimal value.
func addRequestHeader(k string, v uint32) {
	proxyAddHeaderMapValue(mapRequestHeaders, k, strconv.Itoa(int(v)))
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n uint32, eos bool) uint32 {
	s := streams[id]
	path, _ := header(mapRequestHeaders, ":path")
	s.path = path
	proxyIncrementMetric(mRequests, 1)
	switch path {
	case "/add":
		user, _ := header(mapRequestHeaders, "x-user")
		proxyAddHeaderMapValue(mapRequestHeaders, "X-Guest-User", "user="+user)
		proxyReplaceHeaderMapValue(mapRequestHeaders, "x-replace", "replaced")
		proxyRemoveHeaderMapValue(mapRequestHeaders, "x-remove-me")
		addr, _ := property("source", "address")
		proxyAddHeaderMapValue(mapRequestHeaders, "x-source-address", string(addr))
		if _, st := header(mapRequestHeaders, "x-request-id"); st == statusOK {
			proxyAddHeaderMapValue(mapRequestHeaders, "x-has-request-id", "yes")
		}
		proxyAddHeaderMapValue(mapRequestHeaders, "x-headers-seen", strconv.Itoa(int(n)))
		proxyReplaceHeaderMapValue(mapRequestHeaders, ":path", "/rewritten?from=add")
	case "/deny":
		proxySendLocalResponse(403, "denied_by_guest", "denied by guest", encodePairs([][2]string{{"x-denied", "1"}}), -1)
		return actionPause
	case "/call", "/call-grpc":
		ct := "text/plain"
		if path == "/call-grpc" {
			ct = "application/grpc"
		}
		hdrs := encodePairs([][2]string{
			{":method", "POST"}, {":path", "/echo"}, {":authority", config.authority},
			{"content-type", ct}, {"x-from-context", strconv.Itoa(int(id))},
		})
		if st := proxyHTTPCall(config.cluster, hdrs, "ping", "", config.timeoutMs, &retU32); st != statusOK {
			proxySendLocalResponse(500, "call_failed", "proxy_http_call: status "+strconv.Itoa(int(st)), "", -1)
			return actionPause
		}
		calls[retU32] = id
		return actionPause
	case "/call-unknown":
		hdrs := encodePairs([][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "x"}})
		st := proxyHTTPCall("no-such-cluster", hdrs, "", "", 100, &retU32)
		addRequestHeader("x-call-status", st)
	case "/hang":
		return actionPause
	case "/enqueue":
		st := proxyResolveSharedQueue("", "guest-queue", &retU32)
		if st == statusOK {
			st = proxyEnqueueSharedQueue(retU32, "item from context "+strconv.Itoa(int(id)))
		}
		addRequestHeader("x-enqueue", st)
		addRequestHeader("x-resolve-other-vm", proxyResolveSharedQueue("other-vm", "guest-queue", &retU32))
	case "/shared-inc":
		for retries := 0; ; retries++ {
			v, cas, st := sharedGet("counter")
			cur := 0
			if st == statusOK {
				cur, _ = strconv.Atoi(v)
			}
			st = proxySetSharedData("counter", strconv.Itoa(cur+1), cas)
			if st == statusOK {
				addRequestHeader("x-counter", uint32(cur+1))
				break
			}
			if st != statusCasMismatch || retries > 1000 {
				addRequestHeader("x-counter-error", st)
				break
			}
		}
	case "/cas-get":
		_, cas, st := sharedGet("cas-key")
		saved = cas
		addRequestHeader("x-cas-get", st)
	case "/cas-set":
		addRequestHeader("x-cas-set", proxySetSharedData("cas-key", "stale-writer", saved))
	case "/set":
		addRequestHeader("x-set", proxySetSharedData("cas-key", "fresh", 0))
	case "/metrics":
		proxyIncrementMetric(mGauge, 5)
		proxyIncrementMetric(mGauge, -2)
		proxyRecordMetric(mHist, 7)
		proxyGetMetric(mRequests, &retU64)
		addRequestHeader("x-metric-requests", uint32(retU64))
		addRequestHeader("x-metric-zero", proxyIncrementMetric(mRequests, 0))
		addRequestHeader("x-metric-hist-get", proxyGetMetric(mHist, &retU64))
		addRequestHeader("x-metric-unknown", proxyIncrementMetric(999, 1))
	case "/props":
		port, _ := property("source", "port")
		if len(port) == 8 {
			addRequestHeader("x-source-port", uint32(binary.LittleEndian.Uint64(port)))
		}
		p, _ := property("request", "path")
		proxyAddHeaderMapValue(mapRequestHeaders, "x-prop-path", string(p))
		m, _ := property("request", "method")
		proxyAddHeaderMapValue(mapRequestHeaders, "x-prop-method", string(m))
		name, _ := property("plugin_name")
		proxyAddHeaderMapValue(mapRequestHeaders, "x-prop-plugin", string(name))
		_, st := property("response", "code")
		addRequestHeader("x-prop-response-code", st)
		_, st = property("no", "such")
		addRequestHeader("x-prop-missing", st)
		proxyGetCurrentTime(&retU64)
		if t, _ := property("request", "time"); len(t) == 8 && retU64 >= binary.LittleEndian.Uint64(t) {
			proxyAddHeaderMapValue(mapRequestHeaders, "x-time-ok", "yes")
		}
		proxyGetLogLevel(&retU32)
		addRequestHeader("x-log-level", retU32)
		addRequestHeader("x-foreign", proxyCallForeignFunction("anything", "", &retData, &retSize))
	case "/trap":
		var m map[string]int
		m["boom"] = 1 // nil map write: the guest traps
	}
	return actionContinue
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size uint32, eos bool) uint32 {
	if !eos {
		return actionPause
	}
	b, _ := buffer(bufferRequestBody)
	if strings.Contains(string(b), "forbidden") {
		proxySendLocalResponse(403, "body_forbidden", "body forbidden", "", -1)
		return actionPause
	}
	proxySetBufferBytes(bufferRequestBody, 0, uint32(len(b)), strings.ToUpper(string(b)))
	return actionContinue
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, token, nHeaders, bodySize, nTrailers uint32) {
	id, ok := calls[token]
	if !ok {
		logf(logError, "unknown call token")
		return
	}
	delete(calls, token)
	if proxySetEffectiveContext(id) != statusOK {
		return
	}
	if nHeaders == 0 {
		proxyGetStatus(&retU32, &retData, &retSize)
		msg := string(take(retData, retSize))
		proxySendLocalResponse(503, "callout_failed", "callout failed: headers=0 status="+strconv.Itoa(int(retU32))+" message="+msg, "", -1)
		return
	}
	status, _ := header(mapCallHeaders, ":status")
	grpcStatus, _ := header(mapCallHeaders, "grpc-status")
	body, _ := buffer(bufferCallResponse)
	if uint32(len(body)) != bodySize {
		proxySendLocalResponse(500, "callout_body", "body size mismatch", "", -1)
		return
	}
	if status != "200" || (grpcStatus != "" && grpcStatus != "0") {
		msg, _ := header(mapCallHeaders, "grpc-message")
		proxySendLocalResponse(503, "callout_failed", "callout failed: status="+status+" grpc-status="+grpcStatus+" grpc-message="+msg+" body="+string(body), "", -1)
		return
	}
	proxyAddHeaderMapValue(mapRequestHeaders, "x-call-status", status)
	proxyAddHeaderMapValue(mapRequestHeaders, "x-call-body", string(body))
	addRequestHeader("x-call-trailers", nTrailers)
	proxyContinueStream(0)
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n uint32, eos bool) uint32 {
	s := streams[id]
	proxyAddHeaderMapValue(mapResponseHeaders, "x-resp-guest", s.path)
	_, st := header(mapRequestHeaders, ":path")
	proxyAddHeaderMapValue(mapResponseHeaders, "x-req-in-resp", strconv.Itoa(int(st)))
	if s.path == "/resp-local" {
		proxySendLocalResponse(418, "teapot", "teapot from response", "", -1)
		return actionPause
	}
	proxyRemoveHeaderMapValue(mapResponseHeaders, "x-upstream-secret")
	return actionContinue
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	path, _ := header(mapRequestHeaders, ":path")
	status, _ := header(mapResponseHeaders, ":status")
	proxySetSharedData("last-log", path+" "+status, 0)
	proxyIncrementMetric(mLogs, 1)
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size uint32, eos bool) uint32 {
	if streams[id].path != "/resp-body" {
		return actionContinue
	}
	b, _ := buffer(bufferResponseBody)
	proxySetBufferBytes(bufferResponseBody, 0, uint32(len(b)), "<"+strings.ToUpper(string(b))+">")
	return actionContinue
}

//go:wasmexport proxy_on_done
func onDone(id uint32) bool {
	if _, ok := streams[id]; !ok && config.delayDone {
		rootDonePending = true
		return false
	}
	return true
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	if _, ok := streams[id]; ok {
		delete(streams, id)
		proxyIncrementMetric(mDeletes, 1)
		return
	}
	proxySetSharedData("root-deleted", "yes", 0)
}
