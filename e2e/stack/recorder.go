package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Arrival is one request as a Recorder saw it.
type Arrival struct {
	At     time.Time   // when its headers arrived
	Header http.Header // its headers
}

// Recorder is an upstream that answers 200 and records when each request
// arrived, with its headers: what a test of shaping (the filter holding
// requests) measures.
type Recorder struct {
	srv *http.Server
	ln  net.Listener

	mu       sync.Mutex
	arrivals []Arrival
}

// StartRecorder serves a Recorder on addr ("127.0.0.1:0" picks a free port).
func StartRecorder(addr string) (*Recorder, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("recorder: listen on %s: %w", addr, err)
	}
	r := &Recorder{ln: ln}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

// ServeHTTP records the request and answers 200.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	a := Arrival{At: time.Now(), Header: req.Header.Clone()}
	r.mu.Lock()
	r.arrivals = append(r.arrivals, a)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "recorded")
}

// Arrivals returns the requests recorded so far, in arrival order, and
// forgets them.
func (r *Recorder) Arrivals() []Arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.arrivals
	r.arrivals = nil
	return a
}

// Addr returns the recorder's listen address.
func (r *Recorder) Addr() string { return r.ln.Addr().String() }

// Close stops the recorder, waiting up to ctx for requests in progress.
func (r *Recorder) Close(ctx context.Context) error {
	if err := r.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		r.srv.Close()
		return err
	}
	return nil
}
