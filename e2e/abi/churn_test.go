package abi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/filter/core/precheck"
	"github.com/sluicehq/sluice/filter/native/envoystate"
	"github.com/sluicehq/sluice/filter/proxywasm/shareddata"
)

// churnPolicy: one request per tenant an hour, so a tenant's second request
// is refused by the control plane and blocks the tenant (the precheck's
// local bucket of a sliding window of 1 holds two, so that request is
// asked). A sliding window, so that no hour boundary during the test lets
// a second request through.
const churnPolicy = `
domain: abi
descriptors:
  - key: tenant
    rate_limit: {algorithm: sliding_window, unit: hour, requests_per_unit: 1}
`

// Figures of the churn test, and what its bound allows besides the shared
// store (see TestSharedStateChurn).
const (
	churnWorkers    = 2
	churnConns      = 32
	churnMaxEntries = 250 // precheck.max_entries of the plugin: each VM's table
	churnWarmKeys   = 4 * churnWorkers * churnMaxEntries
	// hostEntryBytes is what proxy-wasm-cpp-host spends on one shared-data
	// entry besides its key's and value's bytes (Bound counts those): an
	// unordered_map node holding two std::string and the CAS number, its
	// bucket, and the allocator's rounding of the two strings' buffers.
	hostEntryBytes = 192
	// envoySlackBytes is what Envoy itself may add over a few hundred
	// thousand requests on the same connections once warm: its allocator's
	// caches and stats, none of it per key. The bound's only allowance
	// not derived from the filter's constants, and kept small: a store
	// that kept one entry per key (tried by naming each block's slot by
	// its full hash) grew Envoy's RSS by 13.4 MB over 100,000 keys, where
	// the fixed store grew it by 2.5 MB.
	envoySlackBytes = 2 << 20
	// goSlackBytes is what the Go runtime inside Envoy may add besides
	// twice the live heap: its metadata, the stacks of its goroutines (a
	// worker's timer), and the heap's first 4 MB, which its collector
	// never shrinks below.
	goSlackBytes = 4 << 20
	// churnKeyLen bounds the churn's descriptor keys: "tenant" and a key
	// of at most 7 bytes, each with its length (package descriptors).
	churnKeyLen = 2 + len("tenant") + 7 + 2
)

// churnKeys is the number of distinct keys of the churn: 100,000, or
// $SLUICE_CHURN_KEYS.
func churnKeys(t *testing.T) int {
	if s := os.Getenv("SLUICE_CHURN_KEYS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SLUICE_CHURN_KEYS=%q", s)
		}
		return n
	}
	return 100_000
}

// churnBound is the most Envoy's RSS may grow by over the churn on host.
//
// filter.wasm: every slot of the shared over-limit blocks and of the lease
// pools filled with the longest values (shareddata.Bound, LeaseBound), the
// host's cost of each of those entries, each serving VM's precheck table
// twice over (precheck.Bound: its live memory, and as much of garbage in a
// garbage-collected heap that grows to twice its live size), and Envoy's
// own slack.
//
// The native module: the domain's state with the churn's keys
// (envoystate.BoundFor) and each worker's precheck table, all in the one
// Go heap, twice over (its garbage), the Go runtime's own slack
// (goSlackBytes), and Envoy's.
func churnBound(host string, workers int) int64 {
	if host == stack.Native.Name {
		return int64(2*(envoystate.BoundFor(churnKeyLen, 0)+workers*precheck.Bound(churnMaxEntries)) + goSlackBytes + envoySlackBytes)
	}
	entries := shareddata.Slots + shareddata.LeaseSlots + 2 // the slots, the seed and the lease flag
	return int64(shareddata.Bound(shareddata.Slots) + shareddata.LeaseBound(shareddata.LeaseSlots) +
		entries*hostEntryBytes + workers*2*precheck.Bound(churnMaxEntries) + envoySlackBytes)
}

// churnOutcome counts the answers of a churn.
type churnOutcome struct {
	first, second    [600]atomic.Int64 // by status: each key's first and second request
	failed           atomic.Int64
	mu               sync.Mutex
	done             int                // keys done
	last             [churnConns]string // the last keys done, in a ring by done
	seconds          float64
	firstOK, secOver int64
}

// churn sends every key of keys(0..n-1) twice, in turn on churnConns
// keep-alive connections (HTTP/1.1), key i on connection i % churnConns.
func churn(t *testing.T, url string, n int, key func(int) string) *churnOutcome {
	t.Helper()
	var o churnOutcome
	var wg sync.WaitGroup
	start := time.Now()
	for c := range churnConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			req, _ := http.NewRequest("GET", url, nil)
			for i := c; i < n; i += churnConns {
				k := key(i)
				req.Header.Set("x-tenant", k)
				for r, counts := range []*[600]atomic.Int64{&o.first, &o.second} {
					resp, err := client.Do(req)
					if err != nil {
						if o.failed.Add(1) == 1 {
							t.Errorf("key %s request %d: %v", k, r+1, err)
						}
						return
					}
					io.Copy(io.Discard, resp.Body) // so that the connection is reused
					resp.Body.Close()
					if resp.StatusCode > 0 && resp.StatusCode < 600 {
						counts[resp.StatusCode].Add(1)
					}
				}
				o.mu.Lock()
				o.last[o.done%churnConns] = k
				o.done++
				o.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	o.seconds = time.Since(start).Seconds()
	o.firstOK, o.secOver = o.first[200].Load(), o.second[429].Load()
	return &o
}

// TestSharedStateChurn drives 100,000 distinct keys through one Envoy of
// churnWorkers workers, each key sent just often enough to be blocked (two
// requests on a limit of one), so that every key's denial writes an
// over-limit block into the proxy's shared data. The shared store is a
// fixed table of slots, each block overwriting its slot, so Envoy's RSS
// after the churn stays within the baseline (after a warm-up that filled
// every VM's precheck table) plus churnBound, computed from the filter's
// constants; a store that kept an entry per key would pass it by 100,000
// entries. After the churn the filter still works: a fresh key is admitted
// once and then refused, by the control plane and then by the precheck, and
// the last keys of the churn are refused by the precheck without a call.
//
// On each host: filter.wasm's store is proxy-wasm shared data, the native
// module's process memory (package envoystate).
func TestSharedStateChurn(t *testing.T) {
	progs, _ := programs(t)
	stack.ForEachFilter(t, progs.Filters, func(t *testing.T, f stack.Filter) { churnOn(t, progs, f) })
}

// churnOn is TestSharedStateChurn on filter f.
func churnOn(t *testing.T, progs stack.Programs, f stack.Filter) {
	ctx := context.Background()
	dir := t.TempDir()
	cp, up := backends(t, ctx, progs, dir, churnPolicy)
	plugin := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "2s", FailureMode: "closed",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-tenant", "tenant")}}},
		Precheck:   &stack.Precheck{Enabled: true, MaxEntries: churnMaxEntries}}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: "envoy-churn", Concurrency: churnWorkers, LogLevel: "warning",
		Bootstrap: stack.Bootstrap(
			[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
				f.HTTPFilter("sluice", plugin.JSON()))},
			[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	url := e.URL("in") + "/"

	// Warm-up: enough keys to fill every VM's precheck table, on the
	// churn's own connections.
	w := churn(t, url, churnWarmKeys, func(i int) string { return "w" + strconv.Itoa(i) })
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(time.Second) // let Envoy's workers settle
	base := e.RSS()
	s0 := counters(t, e)

	n := churnKeys(t)
	o := churn(t, url, n, func(i int) string { return "k" + strconv.Itoa(i) })
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(time.Second)
	after := e.RSS()
	s1 := counters(t, e)
	d := func(name string) int64 { return s1[f.Stat("sluice."+name)] - s0[f.Stat("sluice."+name)] }
	bound := base + churnBound(f.Host.Name, churnWorkers)
	t.Logf("warm-up %d keys in %.1fs; churn %d keys (%d requests) in %.1fs = %.0f requests/s on %d connections, %d workers",
		churnWarmKeys, w.seconds, n, 2*n, o.seconds, 2*float64(n)/o.seconds, churnConns, churnWorkers)
	t.Logf("answers: first requests %d x 200, second %d x 429; control plane: %d allowed, %d over limit; precheck %d; "+
		"shared writes: %d CAS retries, %d lost; errors %d",
		o.firstOK, o.secOver, d("allowed"), d("over_limit"), d("precheck_rejected"), d("shared_cas_retries"), d("shared_lost"), d("errors"))
	t.Logf("Envoy RSS: baseline %.1f MB, after the churn %.1f MB (%+.1f MB); bound %.1f MB = baseline + %s",
		mb(base), mb(after), mb(after-base), mb(bound), boundTerms(f.Host.Name))

	// Every key was admitted once, then refused by the control plane (and
	// so blocked in the shared store).
	if o.firstOK != int64(n) || o.secOver != int64(n) || d("over_limit") != int64(n) {
		t.Errorf("%d keys: %d first requests admitted, %d second refused, %d refused by the control plane", n, o.firstOK, o.secOver, d("over_limit"))
	}
	if after > bound {
		t.Errorf("Envoy's RSS grew from %.1f MB to %.1f MB over %d keys: past the bound of %.1f MB", mb(base), mb(after), n, mb(bound))
	}

	// A fresh key: admitted, refused by the control plane, then by the
	// precheck (same connection, same VM).
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for i, want := range []struct {
		code              int
		over, precheckRej int64
	}{{200, 0, 0}, {429, 1, 0}, {429, 0, 1}} {
		c0 := counters(t, e)
		a := get(t, client, url, "x-tenant", "fresh")
		c1 := counters(t, e)
		over := c1[f.Stat("sluice.over_limit")] - c0[f.Stat("sluice.over_limit")]
		pre := c1[f.Stat("sluice.precheck_rejected")] - c0[f.Stat("sluice.precheck_rejected")]
		if a.code != want.code || over != want.over || pre != want.precheckRej {
			t.Errorf("fresh key, request %d: %d (over_limit +%d, precheck +%d), want %d (+%d, +%d)", i+1, a.code, over, pre, want.code, want.over, want.precheckRej)
		}
	}

	// The last keys of the churn, each on a new connection (so on either
	// worker): refused, by the precheck, from the VM's table or the shared
	// store, without a call. A later key hashed to the same slot loses a
	// block (one chance in 4096 per key written after it, at most 31
	// here), so up to two may be asked again.
	c0 := counters(t, e)
	limited := 0
	for _, k := range o.last {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		if get(t, c, url, "x-tenant", k).code == 429 {
			limited++
		}
	}
	c1 := counters(t, e)
	pre := c1[f.Stat("sluice.precheck_rejected")] - c0[f.Stat("sluice.precheck_rejected")]
	shared := c1[f.Stat("sluice.precheck_shared")] - c0[f.Stat("sluice.precheck_shared")]
	t.Logf("the churn's last %d keys: %d refused, %d by the precheck (%d on a block from the shared store)", len(o.last), limited, pre, shared)
	if limited != len(o.last) || pre < int64(len(o.last)-2) {
		t.Errorf("the churn's last %d keys: %d refused, %d of them by the precheck", len(o.last), limited, pre)
	}
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// boundTerms describes the terms of churnBound on host.
func boundTerms(host string) string {
	if host == stack.Native.Name {
		return fmt.Sprintf("2 x (%.2f MB domain state + %.2f MB precheck tables) + %.1f MB Go runtime + %.1f MB Envoy slack",
			mb(int64(envoystate.BoundFor(churnKeyLen, 0))), mb(int64(churnWorkers*precheck.Bound(churnMaxEntries))), mb(goSlackBytes), mb(envoySlackBytes))
	}
	return fmt.Sprintf("%.2f MB blocks + %.2f MB leases + %.2f MB host entries + %.2f MB precheck tables + %.1f MB Envoy slack",
		mb(int64(shareddata.Bound(shareddata.Slots))), mb(int64(shareddata.LeaseBound(shareddata.LeaseSlots))),
		mb(int64((shareddata.Slots+shareddata.LeaseSlots+2)*hostEntryBytes)),
		mb(int64(churnWorkers*2*precheck.Bound(churnMaxEntries))), mb(envoySlackBytes))
}
