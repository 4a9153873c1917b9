package main

import (
	"strconv"
	"testing"
)

func TestExploreCalloutMallocs(t *testing.T) {
	h := newWasmHostShared(t, t.Context(), filterWasmDev, sharedConfig, newHostShared())
	if !h.configure() {
		t.Fatal(h.logs)
	}
	h.quiet = true
	admitted := hostAdmittedOne(t)
	run := func(from, n int) {
		for i := from; i < from+n; i++ {
			id := uint32(100 + i%2)
			req := map[string]string{":method": "GET", ":path": "/", "x-user": "u" + strconv.Itoa(i%10000)}
			h.headers[id], h.current = req, id
			h.call("proxy_on_context_create", uint64(id), 1)
			h.call("proxy_on_request_headers", uint64(id), 3, 1)
			h.deliver(uint32(len(h.calls)), admitted)
			h.current = id
			h.call("proxy_on_response_headers", uint64(id), 3, 0)
			h.call("proxy_on_log", uint64(id))
			h.call("proxy_on_done", uint64(id))
			h.call("proxy_on_delete", uint64(id))
		}
	}
	run(0, 20000)
	before := h.call("sluice_test_mallocs")
	run(20000, 1000)
	after := h.call("sluice_test_mallocs")
	t.Logf("mallocs per callout request: %.2f", float64(after-before)/1000)
}

func BenchmarkExploreCallout(b *testing.B) {
	for _, conf := range []struct{ name, c string }{
		{"shared", sharedConfig},
		{"noprecheck", `{"cluster": "rls", "domain": "bench", "timeout": "100ms",
	"rate_limits": [{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}],
	"precheck": {"enabled": false}, "headers": {"draft10": true, "retry_after": true}}`},
		{"noheaders", `{"cluster": "rls", "domain": "bench", "timeout": "100ms",
	"rate_limits": [{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}],
	"precheck": {"enabled": false}, "headers": {"draft10": false, "legacy": false, "retry_after": false}}`},
	} {
		b.Run(conf.name, func(b *testing.B) {
			h := newWasmHostShared(b, b.Context(), filterWasm, conf.c, newHostShared())
			if !h.configure() {
				b.Fatal(h.logs)
			}
			h.quiet = true
			admitted := hostAdmittedOne(b)
			reqs := make([]map[string]string, 10000)
			for i := range reqs {
				reqs[i] = map[string]string{":method": "GET", ":path": "/", "x-user": "u" + strconv.Itoa(i)}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := uint32(100 + i%2)
				req := reqs[i%len(reqs)]
				h.headers[id], h.current = req, id
				h.call("proxy_on_context_create", uint64(id), 1)
				h.call("proxy_on_request_headers", uint64(id), 3, 1)
				h.deliver(uint32(len(h.calls)), admitted)
				h.current = id
				h.call("proxy_on_response_headers", uint64(id), 3, 0)
				h.call("proxy_on_log", uint64(id))
				h.call("proxy_on_done", uint64(id))
				h.call("proxy_on_delete", uint64(id))
			}
		})
	}
}
