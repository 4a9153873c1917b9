package host

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkStreamLifecycle measures one request through a VM with the stream
// API: proxy_on_context_create, proxy_on_request_headers (the guest reads
// :path and increments a counter), proxy_on_log, proxy_on_done,
// proxy_on_delete.
func BenchmarkStreamLifecycle(b *testing.B) {
	h, _ := newHost(b, Config{Workers: 1})
	vm := h.VM(0)
	hdrs := Headers{{":authority", "example"}, {":path", "/plain"}, {":method", "GET"}, {":scheme", "http"}, {"x-user", "alice"}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := vm.NewStream(StreamInfo{RemoteAddr: "10.0.0.1:1"})
		if err != nil {
			b.Fatal(err)
		}
		if d := st.RequestHeaders(hdrs, true); d.Kind != DecisionContinue {
			b.Fatal(d.Kind)
		}
		st.Finish()
	}
}

// BenchmarkProxyInProcess measures the whole Proxy (filter, ReverseProxy,
// response callbacks) with an in-process upstream, in parallel on 2 VMs.
func BenchmarkProxyInProcess(b *testing.B) {
	h, _ := newHost(b, Config{Workers: 2})
	p := NewHandlerProxy(h, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("GET", "/plain", nil)
			w := httptest.NewRecorder()
			p.ServeHTTP(w, r)
			if w.Code != 200 {
				b.Fatal(w.Code)
			}
		}
	})
}
