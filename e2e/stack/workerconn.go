package stack

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Time limits of WorkerConn.
const (
	workerConnTimeout = 15 * time.Second // one request and its response
	acceptTimeout     = 5 * time.Second  // until a worker counts a new connection
	maxDialsPerConn   = 40               // dials per connection kept, before giving up
)

// WorkerConn is one HTTP/1.1 connection to an Envoy listener, served by a
// known worker thread. Envoy runs one Wasm VM per worker, and a connection
// stays on the worker that accepted it, so every request sent on a
// WorkerConn meets the same VM. Requests on one WorkerConn go one at a time.
type WorkerConn struct {
	// Worker is the index of the worker thread (and so of the VM) serving
	// the connection.
	Worker int

	addr string // the listener's host:port

	mu   sync.Mutex
	conn net.Conn
	br   *bufio.Reader
	dead error // set once the connection cannot be used any more
}

// Do sends req on the connection and returns the response with its body
// read. A response asking to close the connection, or any error, ends the
// WorkerConn: later calls fail, for a test that counts on the worker.
func (w *WorkerConn) Do(req *http.Request) (*http.Response, []byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead != nil {
		return nil, nil, w.dead
	}
	fail := func(err error) (*http.Response, []byte, error) {
		w.dead = fmt.Errorf("connection to worker %d: %w", w.Worker, err)
		w.conn.Close()
		return nil, nil, w.dead
	}
	w.conn.SetDeadline(time.Now().Add(workerConnTimeout))
	if err := req.Write(w.conn); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(w.br, req)
	if err != nil {
		return fail(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fail(err)
	}
	if resp.Close {
		w.dead = fmt.Errorf("connection to worker %d: closed by Envoy after status %d", w.Worker, resp.StatusCode)
		w.conn.Close()
	}
	return resp, body, nil
}

// Addr returns the listener's address (host:port), for the requests' URLs.
func (w *WorkerConn) Addr() string { return w.addr }

// Close closes the connection.
func (w *WorkerConn) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead == nil {
		w.dead = errors.New("connection closed")
	}
	return w.conn.Close()
}

// WorkerConns opens perWorker connections to the named static listener for
// each of Envoy's worker threads, and returns them ordered by worker (see
// WorkerConnsTo).
func (e *Envoy) WorkerConns(listener string, perWorker int) ([]*WorkerConn, error) {
	addr := e.ListenerAddr(listener)
	if addr == "" {
		return nil, fmt.Errorf("envoy %s: no listener %q", e.cfg.Name, listener)
	}
	prefix, err := e.listenerStatPrefix(listener)
	if err != nil {
		return nil, err
	}
	return e.WorkerConnsTo(addr, prefix, perWorker)
}

// WorkerConnsTo opens perWorker connections to the listener at addr, whose
// statistics Envoy keeps under listener.<statPrefix>., for each of Envoy's
// worker threads, and returns them ordered by worker. The kernel spreads
// connections over the workers (SO_REUSEPORT); each connection is kept or
// closed after Envoy's per-worker listener counters
// (listener.<statPrefix>.worker_<i>.downstream_cx_total) say which worker
// took it. Nothing else may connect to the listener meanwhile.
func (e *Envoy) WorkerConnsTo(addr, prefix string, perWorker int) ([]*WorkerConn, error) {
	workers := e.cfg.Concurrency
	accepted := func() ([]int64, error) {
		s, err := e.Stats()
		if err != nil {
			return nil, err
		}
		n := make([]int64, workers)
		for i := range n {
			n[i] = s["listener."+prefix+".worker_"+strconv.Itoa(i)+".downstream_cx_total"]
		}
		return n, nil
	}
	var conns []*WorkerConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	have := make([]int, workers)
	for dials := 0; len(conns) < workers*perWorker; dials++ {
		if dials >= maxDialsPerConn*workers*perWorker {
			closeAll()
			return nil, fmt.Errorf("envoy %s: %d connections to %s did not reach every worker (%v per worker)", e.cfg.Name, dials, addr, have)
		}
		before, err := accepted()
		if err != nil {
			closeAll()
			return nil, err
		}
		conn, err := net.DialTimeout("tcp", addr, acceptTimeout)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("envoy %s: %w", e.cfg.Name, err)
		}
		worker, err := e.waitAccepted(accepted, before)
		if err != nil {
			conn.Close()
			closeAll()
			return nil, err
		}
		if have[worker] >= perWorker {
			conn.Close()
			continue
		}
		have[worker]++
		conns = append(conns, &WorkerConn{Worker: worker, addr: addr, conn: conn, br: bufio.NewReader(conn)})
	}
	sort.SliceStable(conns, func(i, j int) bool { return conns[i].Worker < conns[j].Worker })
	return conns, nil
}

// waitAccepted waits until one worker's accepted-connections counter has
// grown past before, and returns that worker.
func (e *Envoy) waitAccepted(accepted func() ([]int64, error), before []int64) (int, error) {
	deadline := time.Now().Add(acceptTimeout)
	for {
		after, err := accepted()
		if err != nil {
			return 0, err
		}
		worker, grown := -1, 0
		for i := range after {
			if after[i] > before[i] {
				worker, grown = i, grown+int(after[i]-before[i])
			}
		}
		switch {
		case grown == 1:
			return worker, nil
		case grown > 1:
			return 0, fmt.Errorf("envoy %s: another client connected meanwhile (%v -> %v)", e.cfg.Name, before, after)
		case time.Now().After(deadline):
			return 0, fmt.Errorf("envoy %s: no worker accepted the connection within %v", e.cfg.Name, acceptTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// listenerStatPrefix returns the name under which Envoy counts the named
// listener's statistics: its stat_prefix, else its configured address
// ("127.0.0.1_0").
func (e *Envoy) listenerStatPrefix(name string) (string, error) {
	sr, _ := e.cfg.Bootstrap["static_resources"].(M)
	ls, _ := sr["listeners"].([]M)
	for _, l := range ls {
		if l["name"] != name {
			continue
		}
		if p, ok := l["stat_prefix"].(string); ok && p != "" {
			return p, nil
		}
		a, _ := l["address"].(M)
		sa, _ := a["socket_address"].(M)
		return fmt.Sprintf("%v_%v", sa["address"], sa["port_value"]), nil
	}
	return "", fmt.Errorf("envoy %s: listener %q is not in the bootstrap's static listeners", e.cfg.Name, name)
}

// LookupListener asks Envoy's admin interface for the address the named
// listener is bound to: for listeners added after start-up (from a
// ConfigFile), which ListenerAddr does not know. It returns "" while there
// is no such listener or it is not bound yet.
func (e *Envoy) LookupListener(name string) (string, error) {
	probe := &Envoy{cfg: e.cfg, adminURL: e.adminURL}
	err := probe.readListeners(&http.Client{Timeout: 5 * time.Second})
	if err != nil && !strings.Contains(err.Error(), "not bound yet") {
		return "", fmt.Errorf("envoy %s: listeners: %w", e.cfg.Name, err)
	}
	return probe.listeners[name], nil
}
