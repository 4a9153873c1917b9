package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestPrecheckReplyNamesTheControlPlanesLimit checks the names in a
// precheck 429: the control plane's (current_limit.name) for each
// descriptor, even when descriptors of one rate limit have differently
// named limits and their replies alternate (the reply cache), and the
// descriptor keys when the control plane named none.
func TestPrecheckReplyNamesTheControlPlanesLimit(t *testing.T) {
	b := newTestbed(t, retryConfig)
	deny := func(key, name string) {
		b.request(map[string]string{"x-api-key": key}, "")
		b.deliver(grpcOK(t, &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: name},
			}},
			DynamicMetadata: metadata(t, map[string]any{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "retry_after_ms": 30000}),
		}))
	}
	deny("gold-1", "gold")
	deny("free-1", "free")
	deny("anon-1", "")
	for i := 0; i < 2; i++ {
		for key, want := range map[string]string{"gold-1": `"gold";q=5;w=60`, "free-1": `"free";q=5;w=60`, "anon-1": `"api_key";q=5;w=60`} {
			id, _ := b.request(map[string]string{"x-api-key": key}, "")
			l := b.host.local[id]
			if v, _ := header(l.headers, "ratelimit-policy"); l.details != DetailsPrecheck || v != want {
				t.Fatalf("%s: %s RateLimit-Policy %q, want %q", key, l.details, v, want)
			}
		}
	}
	// The control plane renames the limit: the next precheck reply follows.
	b.host.now += int64(31 * time.Second)
	deny("gold-1", "platinum")
	id, _ := b.request(map[string]string{"x-api-key": "gold-1"}, "")
	if v, _ := header(b.host.local[id].headers, "ratelimit"); v != `"platinum";r=0;t=30` {
		t.Fatalf("after a rename: RateLimit %q", v)
	}
}

// teach answers the last call OK, reporting a failure mode per descriptor
// ("" leaves the field out).
func (b *testbed) teach(modes ...string) {
	b.t.Helper()
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(modes))
	elems := make([]map[string]any, len(modes))
	for i, m := range modes {
		statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 9}
		elems[i] = map[string]any{"algorithm": "fixed_window", "limit": 10, "window_ms": 1000}
		if m != "" {
			elems[i]["failure_mode"] = m
		}
	}
	b.deliver(grpcOK(b.t, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses, DynamicMetadata: metadata(b.t, elems...),
	}))
}

// TestPerPolicyFailureModes checks the failure mode applied when the check
// fails, from what the control plane last said about the request's
// descriptors (remote_address, then api_key.path in testConfig): closed if
// any is closed, else open if any is open, else the plugin's failure_mode;
// for every kind of failure.
func TestPerPolicyFailureModes(t *testing.T) {
	failures := []struct {
		name string
		fail func(b *testbed) (id uint32, action Action)
	}{
		{"call refused", func(b *testbed) (uint32, Action) {
			b.host.callErr = errors.New("BAD_ARGUMENT")
			return b.request(apiRequest, "10.0.0.1:1")
		}},
		{"timeout", func(b *testbed) (uint32, Action) {
			id, action := b.request(apiRequest, "10.0.0.1:1")
			b.deliver(nil)
			return id, action
		}},
		{"grpc error", func(b *testbed) (uint32, Action) {
			id, action := b.request(apiRequest, "10.0.0.1:1")
			b.deliver(&fakeAnswer{headers: map[string]string{":status": "200"}, trailers: map[string]string{"grpc-status": "14"}})
			return id, action
		}},
		{"never answered", func(b *testbed) (uint32, Action) {
			id, action := b.request(apiRequest, "10.0.0.1:1")
			b.host.now += int64(25*time.Millisecond + time.Second + 1)
			b.runTick()
			return id, action
		}},
		{"panic in request headers", func(b *testbed) (uint32, Action) {
			// The panic comes with the second descriptor's header: only
			// the first descriptor is known.
			b.host.panicOnHeader = true
			return b.request(apiRequest, "10.0.0.1:1")
		}},
	}
	for _, tt := range []struct {
		modes        [2]string // taught per descriptor; "" = not reported
		open, closed bool      // refused, under plugin failure_mode open and closed
	}{
		{[2]string{"", ""}, false, true},
		{[2]string{"open", ""}, false, false},
		{[2]string{"", "open"}, false, false},
		{[2]string{"closed", ""}, true, true},
		{[2]string{"open", "closed"}, true, true},
		{[2]string{"closed", "open"}, true, true},
		{[2]string{"open", "open"}, false, false},
		{[2]string{"bogus", ""}, false, true},
	} {
		for _, plugin := range []string{"open", "closed"} {
			for _, f := range failures {
				name := "taught " + tt.modes[0] + "," + tt.modes[1] + "/plugin " + plugin + "/" + f.name
				t.Run(name, func(t *testing.T) {
					b := newTestbed(t, withFailureMode(plugin))
					b.request(apiRequest, "10.0.0.1:1")
					b.teach(tt.modes[0], tt.modes[1])
					id, action := f.fail(b)
					refused := tt.open
					if plugin == "closed" {
						refused = tt.closed
					}
					if f.name == "panic in request headers" {
						// Only the first descriptor was built: its mode,
						// else the plugin's.
						switch tt.modes[0] {
						case "closed":
							refused = true
						case "open":
							refused = false
						default:
							refused = plugin == "closed"
						}
					}
					l, replied := b.host.local[id]
					mode := "open"
					if refused {
						mode = "closed"
						if !replied || l.status != 500 || l.details != DetailsFailure || b.host.counters[MetricFailureClosed] != 1 {
							t.Fatalf("not refused: reply %+v, action %d, counters %v", l, action, b.host.counters)
						}
					} else if replied || b.host.counters[MetricFailureOpen] != 1 {
						t.Fatalf("not let through: reply %+v, action %d, counters %v", l, action, b.host.counters)
					}
					if !b.host.logged("rate limit check failed, failing " + mode) {
						t.Fatalf("log does not say failing %s: %v", mode, b.host.logs)
					}
				})
			}
		}
	}
}

// TestPerPolicyFailureModeIsPerDescriptor checks that what was learnt
// about one descriptor does not decide for another (another client's
// address and key: the plugin's failure mode), and that a later answer
// without a failure mode forgets it.
func TestPerPolicyFailureModeIsPerDescriptor(t *testing.T) {
	b := newTestbed(t, withFailureMode("open"))
	b.request(apiRequest, "10.0.0.1:1")
	b.teach("closed", "closed")
	b.host.callErr = errors.New("BAD_ARGUMENT")
	other := map[string]string{":method": "GET", ":path": "/v1/items", "x-api-key": "k2"}
	if id, action := b.request(other, "10.0.0.2:1"); action != Continue || len(b.host.local) != 0 {
		t.Fatalf("another client was refused: action %d, reply %+v", action, b.host.local[id])
	}
	if id, _ := b.request(apiRequest, "10.0.0.1:1"); b.host.local[id].status != 500 {
		t.Fatalf("the taught client was not refused: %+v", b.host.local[id])
	}
	b.host.callErr = nil
	b.request(apiRequest, "10.0.0.1:1")
	b.teach("", "")
	b.host.callErr = errors.New("BAD_ARGUMENT")
	if id, action := b.request(apiRequest, "10.0.0.1:1"); action != Continue || len(b.host.local) != 1 {
		t.Fatalf("a forgotten failure mode still refused: action %d, reply %+v", action, b.host.local[id])
	}
}

// TestPerPolicyFailureModeWithoutPrecheck checks that the failure modes
// are remembered with the precheck off, which then rejects nothing.
func TestPerPolicyFailureModeWithoutPrecheck(t *testing.T) {
	b := newTestbed(t, strings.Replace(withFailureMode("open"), `"domain"`, `"precheck": false, "domain"`, 1))
	b.request(apiRequest, "10.0.0.1:1")
	b.teach("", "closed")
	b.request(apiRequest, "10.0.0.1:1")
	b.deliver(nil)
	if len(b.host.local) != 1 || b.host.counters[MetricFailureClosed] != 1 {
		t.Fatalf("replies %v, counters %v", b.host.local, b.host.counters)
	}
}
