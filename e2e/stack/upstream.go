package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is the service behind the gateways: it answers every request with
// 200 and a short text, and counts the requests that reached it, in total
// and per value of a header (the API key, for instance).
type Upstream struct {
	srv    *http.Server
	ln     net.Listener
	header string // header whose values are counted separately

	total atomic.Int64 // requests served
	mu    sync.Mutex
	byKey map[string]int64 // requests served per value of header
}

// StartUpstream serves an Upstream on addr ("127.0.0.1:0" picks a free port).
// countHeader, when not empty, names the header whose values are counted
// separately (see ByKey).
func StartUpstream(addr, countHeader string) (*Upstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: listen on %s: %w", addr, err)
	}
	u := &Upstream{ln: ln, header: countHeader, byKey: make(map[string]int64)}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(ln)
	return u, nil
}

// ServeHTTP answers 200 with what was asked, and counts the request.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.total.Add(1)
	if u.header != "" {
		if v := r.Header.Get(u.header); v != "" {
			u.mu.Lock()
			u.byKey[v]++
			u.mu.Unlock()
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "hello from the upstream: %s %s\n", r.Method, r.URL.RequestURI())
}

// URL returns the upstream's base URL, http://127.0.0.1:port.
func (u *Upstream) URL() string { return "http://" + u.ln.Addr().String() }

// Addr returns the upstream's listen address.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// Total returns how many requests reached the upstream.
func (u *Upstream) Total() int64 { return u.total.Load() }

// ByKey returns how many requests carrying the counted header with value v
// reached the upstream.
func (u *Upstream) ByKey(v string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.byKey[v]
}

// Close stops the upstream, waiting up to ctx for requests in progress.
func (u *Upstream) Close(ctx context.Context) error {
	if err := u.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		u.srv.Close()
		return err
	}
	return nil
}
