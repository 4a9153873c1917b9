package rlqs

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// upstream answers 200 and records when each request of each Envoy (the
// x-envoy header) arrived: the admitted requests.
type upstream struct {
	srv *http.Server
	ln  net.Listener
	mu  sync.Mutex
	at  map[string][]time.Time
}

func startUpstream() (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{ln: ln, at: map[string][]time.Time{}}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go u.srv.Serve(ln)
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	u.mu.Lock()
	u.at[r.Header.Get("x-envoy")] = append(u.at[r.Header.Get("x-envoy")], now)
	u.mu.Unlock()
	io.WriteString(w, "ok\n")
}

// count returns how many requests of envoy arrived in [from, to).
func (u *upstream) count(envoy string, from, to time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, t := range u.at[envoy] {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

func (u *upstream) close() { u.srv.Close() }

// load sends GET requests to url at a fixed rate (open loop) until ctx ends,
// with at most maxInFlight at once (ticks past it are counted in skipped).
type load struct {
	sent, ok, limited, failed, skipped atomic.Int64

	mu        sync.Mutex
	limitedAt []time.Time // when each 429 came back
}

// limitedIn returns how many 429s came back in [from, to).
func (l *load) limitedIn(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, t := range l.limitedAt {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

const maxInFlight = 64

func (l *load) run(ctx context.Context, url, envoy string, rate float64) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight}}
	defer client.CloseIdleConnections()
	slots := make(chan struct{}, maxInFlight)
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		next = next.Add(interval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		select {
		case slots <- struct{}{}:
		default:
			l.skipped.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			l.sent.Add(1)
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			req.Header.Set("x-envoy", envoy)
			resp, err := client.Do(req)
			if err != nil {
				l.failed.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				l.ok.Add(1)
			case http.StatusTooManyRequests:
				l.limited.Add(1)
				l.mu.Lock()
				l.limitedAt = append(l.limitedAt, time.Now())
				l.mu.Unlock()
			default:
				l.failed.Add(1)
			}
		}()
	}
}
