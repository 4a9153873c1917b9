package main

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluicehq/sluice/e2e/stack"
)

// backends builds the sluicetest build of libsluice.so (its requests can
// make it panic) into a directory of the test's, and starts a counting
// rate limit service and an upstream, stopped when the test ends.
func backends(t *testing.T) (dir, so string, rls *countingRLS, up *stack.Upstream) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the module and runs Envoy")
	}
	dir = t.TempDir()
	so = filepath.Join(dir, "libsluice.so")
	if err := stack.BuildNativeTest(context.Background(), so); err != nil {
		t.Fatal(err)
	}
	rls = startCountingRLS(t)
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(context.Background()) })
	return dir, so, rls, up
}

// countingRLS is a fake rate limit service: OVER_LIMIT for api_key
// "blocked" (1 an hour, reset in an hour), OK with a quota of 10 for an
// hour for "leased", OK for any other; it counts the calls per key.
type countingRLS struct {
	*stack.FakeRLS
	mu    sync.Mutex
	calls map[string]int
}

func startCountingRLS(t *testing.T) *countingRLS {
	t.Helper()
	r := &countingRLS{calls: map[string]int{}}
	var err error
	r.FakeRLS, err = stack.StartFakeRLS("127.0.0.1:0", func(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		key := req.GetDescriptors()[0].GetEntries()[0].GetValue()
		r.mu.Lock()
		r.calls[key]++
		r.mu.Unlock()
		if key == "blocked" {
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
					CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR},
					DurationUntilReset: durationpb.New(time.Hour)}}}, nil
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if key == "leased" {
			st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 10,
				ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(time.Now().Add(time.Hour))}}
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func (r *countingRLS) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

// nativePlugin is a plugin configuration: api_key from x-api-key, the
// precheck on, failure_mode mode, no lease prefetch (the calls counted
// are the requests').
func nativePlugin(domain, mode, timeout string) []byte {
	return []byte(`{"cluster":"cp","domain":"` + domain + `","timeout":"` + timeout + `","failure_mode":"` + mode +
		`","status_on_error":503,"precheck":true,"lease_prefetch":false,` +
		`"rate_limits":[{"actions":[{"request_headers":{"header_name":"x-api-key","descriptor_key":"api_key"}}]}]}`)
}

// get sends GET url with headers (name, value pairs) on a new connection
// and returns the status.
func get(t *testing.T, url string, headers ...string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s %v: %v", url, headers, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestPanicLeavesEnvoyServing makes the module panic in its hooks inside
// real Envoy: while a request is decided (its request headers, the
// control plane's answer) the failure mode decides it, open or closed, and
// counts an error; after (its response headers) the response goes on.
// Envoy serves on, and so does the module, on every worker.
func TestPanicLeavesEnvoyServing(t *testing.T) {
	ctx := context.Background()
	dir, so, rls, up := backends(t)
	listener := func(name, mode string) stack.M {
		return stack.HTTPListener(name, 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
			stack.NativeFilterFile(so, "sluice", nativePlugin("panic", mode, "5s"), "wasmcustom"))
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Bootstrap: stack.Bootstrap(
		[]stack.M{listener("open", "open"), listener("closed", "closed")},
		[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster("cp", rls.Addr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	stat := func(name string) int64 { return e.Stat("wasmcustom.sluice." + name) }
	for i, c := range []struct {
		hook           string
		open, closed   int // the statuses on each listener
		errs, failures int64
	}{
		{"request_headers", 200, 503, 2, 1},
		{"answer", 200, 503, 2, 1},
		{"response_headers", 200, 200, 0, 0},
	} {
		errs, opened, closed := stat("errors"), stat("failure_open"), stat("failure_closed")
		key := "k" + string(rune('0'+i))
		if got := get(t, e.URL("open")+"/", "x-api-key", key, testPanicHeader, c.hook); got != c.open {
			t.Errorf("panic in %s, failure mode open: status %d, want %d", c.hook, got, c.open)
		}
		if got := get(t, e.URL("closed")+"/", "x-api-key", key, testPanicHeader, c.hook); got != c.closed {
			t.Errorf("panic in %s, failure mode closed: status %d, want %d", c.hook, got, c.closed)
		}
		if d := [3]int64{stat("errors") - errs, stat("failure_open") - opened, stat("failure_closed") - closed}; d != [3]int64{c.errs, c.failures, c.failures} {
			t.Errorf("panic in %s: errors, failed open, failed closed grew by %v, want %v", c.hook, d, [3]int64{c.errs, c.failures, c.failures})
		}
	}
	for _, hook := range []string{"request_headers", "answer", "response_headers"} {
		if !strings.Contains(e.Log(), "sluicetest: a panic asked for in "+hook) {
			t.Errorf("the panic in %s is not in Envoy's log:\n%s", hook, e.LogExcerpt())
		}
	}
	// Envoy and the module serve on: every worker decides again.
	allowed := stat("allowed")
	for range 8 {
		for _, l := range []string{"open", "closed"} {
			if got := get(t, e.URL(l)+"/", "x-api-key", "after"); got != 200 {
				t.Fatalf("after the panics, %s: status %d", l, got)
			}
		}
	}
	if n := stat("allowed") - allowed; n != 16 {
		t.Errorf("after the panics the control plane admitted %d requests through the module, want 16", n)
	}
}

// TestStateAcrossReload: Envoy replaces a listener (an LDS update with a
// new plugin configuration of the same domain): the new configuration's
// workers start with empty precheck tables, but the per-Envoy state of
// the domain is kept, so a key blocked before the update is refused
// locally after it, from the shared block, without a call, and a key's
// lease pool granted before it admits requests after it, without a call.
// Once no listener uses the domain any more (removed, and drained), its
// state is dropped: the same listener added back asks the control plane
// again for both keys.
func TestStateAcrossReload(t *testing.T) {
	ctx := context.Background()
	dir, so, rls, up := backends(t)
	lds, err := stack.NewListenerFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	listener := func(timeout string) stack.M {
		return stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
			stack.NativeFilterFile(so, "sluice", nativePlugin("reload", "open", timeout), "wasmcustom"))
	}
	if err := lds.Write(listener("5s")); err != nil {
		t.Fatal(err)
	}
	boot := stack.Bootstrap(nil, []stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster("cp", rls.Addr())})
	boot["dynamic_resources"] = stack.M{"lds_config": lds.ConfigSource()}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Bootstrap: boot, Args: []string{"--drain-time-s", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	// update writes a new version of the listeners and returns the address
	// of "in" once Envoy serves it ("" when it is removed).
	update := func(ls ...stack.M) string {
		t.Helper()
		ok := e.Stat("listener_manager.lds.update_success")
		if err := lds.Write(ls...); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for e.Stat("listener_manager.lds.update_success") == ok {
			if time.Now().After(deadline) {
				t.Fatalf("Envoy did not apply the update:\n%s", e.LogExcerpt())
			}
			time.Sleep(10 * time.Millisecond)
		}
		addr, err := e.LookupListener("in")
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
	addr := ""
	for addr == "" {
		if addr, err = e.LookupListener("in"); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(name string) int64 { return e.Stat("wasmcustom.sluice." + name) }

	// Blocked: the control plane's denial blocks the key in the domain.
	for i, want := range []int{429, 429} {
		if got := get(t, "http://"+addr+"/", "x-api-key", "blocked"); got != want {
			t.Fatalf("before the update, request %d: status %d", i, got)
		}
	}
	if n := rls.count("blocked"); n != 1 {
		t.Fatalf("the control plane was asked %d times for the blocked key, want once (then the precheck)", n)
	}
	if got := get(t, "http://"+addr+"/", "x-api-key", "leased"); got != 200 || rls.count("leased") != 1 {
		t.Fatalf("the leased key's first request: status %d, %d calls", got, rls.count("leased"))
	}

	// The update: a new configuration of the same domain.
	addr = update(listener("6s"))
	shared := stat("precheck_shared")
	if got := get(t, "http://"+addr+"/", "x-api-key", "blocked"); got != 429 {
		t.Fatalf("after the update: status %d", got)
	}
	if n := rls.count("blocked"); n != 1 {
		t.Errorf("after the update the control plane was asked again (%d calls): the domain's blocks were not kept", n)
	}
	if stat("precheck_shared") != shared+1 {
		t.Errorf("after the update the refusal did not come from the shared block (precheck_shared %d -> %d)", shared, stat("precheck_shared"))
	}
	quota := stat("quota_allowed")
	for i := range 3 {
		if got := get(t, "http://"+addr+"/", "x-api-key", "leased"); got != 200 {
			t.Fatalf("after the update, leased request %d: status %d", i, got)
		}
	}
	if n, q := rls.count("leased"), stat("quota_allowed")-quota; n != 1 || q != 3 {
		t.Errorf("after the update the leased key made %d calls in all and %d requests came from its pool, want 1 and 3: the pool was not kept", n, q)
	}

	// Removed and drained: the domain's last configuration is gone.
	if a := update(); a != "" {
		t.Fatalf("listener in still bound at %s after its removal", a)
	}
	deadline := time.Now().Add(30 * time.Second)
	for e.Stat("listener_manager.total_listeners_draining") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the removed listener is still draining")
		}
		time.Sleep(20 * time.Millisecond)
	}
	addr = update(listener("5s"))
	if got := get(t, "http://"+addr+"/", "x-api-key", "blocked"); got != 429 {
		t.Fatalf("added back: status %d", got)
	}
	if n := rls.count("blocked"); n != 2 {
		t.Errorf("added back after the drain, the control plane was asked %d times in all, want 2: the domain's state was not dropped", n)
	}
	if got := get(t, "http://"+addr+"/", "x-api-key", "leased"); got != 200 || rls.count("leased") != 2 {
		t.Errorf("added back after the drain, the leased key: status %d, %d calls in all, want 2: its pool was not dropped", got, rls.count("leased"))
	}
}
