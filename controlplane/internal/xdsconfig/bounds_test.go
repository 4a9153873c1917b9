package xdsconfig

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// limited is a descriptor with a limit of its own.
func limited(value string) *rlsconfv3.RateLimitDescriptor {
	return &rlsconfv3.RateLimitDescriptor{Key: "user", Value: value,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 5}}
}

// rawAny wraps wire bytes as a RateLimitConfig resource.
func rawAny(wire []byte) *anypb.Any { return &anypb.Any{TypeUrl: TypeURL, Value: wire} }

// nested returns a descriptor with depth levels.
func nested(depth int) *rlsconfv3.RateLimitDescriptor {
	d := limited("leaf")
	for range depth - 1 {
		d = &rlsconfv3.RateLimitDescriptor{Key: "k", Descriptors: []*rlsconfv3.RateLimitDescriptor{d}}
	}
	return d
}

// TestDecodeSetBounds: a response past a bound of the policy set is
// refused whole, with an error naming the bound (and the resource that
// passes it), before any resource is decoded; the largest response within
// the bounds is accepted.
func TestDecodeSetBounds(t *testing.T) {
	tiny := &rlsconfv3.RateLimitConfig{Name: "evil", Domain: "evil", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k"}}}
	long := &rlsconfv3.RateLimitConfig{Name: "long", Domain: "long", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", Value: strings.Repeat("v", 1000)}}}
	many := func(n int) []*anypb.Any {
		out := make([]*anypb.Any, n)
		for i := range out {
			out[i] = rawAny(xdstest.Repeat(t, tiny, 1))
		}
		return out
	}
	limits := func(n int) []*anypb.Any {
		return []*anypb.Any{rawAny(xdstest.Repeat(t, &rlsconfv3.RateLimitConfig{Name: "lim", Domain: "lim",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{limited("v")}}, n))}
	}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"domains", many(policy.MaxDomains + 1), "257 resources: a policy set holds at most 256 domains"},
		{"resource bytes", []*anypb.Any{rawAny(xdstest.Repeat(t, tiny, 210_000))}, `resource "evil": 1050012 bytes, more than the 1048576 (1 MiB)`},
		{"set bytes", []*anypb.Any{rawAny(xdstest.Repeat(t, long, 1000)), rawAny(xdstest.Repeat(t, long, 1000)),
			rawAny(xdstest.Repeat(t, long, 1000)), rawAny(xdstest.Repeat(t, long, 1000)), rawAny(xdstest.Repeat(t, long, 1000))},
			`resource "long": its 1009012 bytes take the response to 5045060 bytes, more than the 4194304 (4 MiB) a policy set may hold`},
		{"descriptors", []*anypb.Any{rawAny(xdstest.Repeat(t, tiny, policy.MaxDescriptors+1))}, `resource "evil": too many descriptors: this domain's 20001 take the set to 20001, more than 20000`},
		{"limits", limits(policy.MaxLimits + 1), `resource "lim": too many limits: this domain's 10001 take the set to 10001, more than 10000`},
		{"depth", anyOf(t, &rlsconfv3.RateLimitConfig{Name: "deep", Domain: "deep", Descriptors: []*rlsconfv3.RateLimitDescriptor{nested(maxDescriptorDepth + 1)}}),
			`resource "deep": descriptors nested too deeply: more than 64 levels`},
		{"malformed", []*anypb.Any{rawAny([]byte{0x1a, 0x05, 0x0a})}, `resource "#0": cannot decode`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Decode(tc.res)
			if set != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode: %v, want the error %q", err, tc.want)
			}
		})
	}
	// About the largest set the bounds allow: 256 domains, 9,984 limits.
	set, err := Decode(anyOf(t, xdstest.Wide(policy.MaxDomains, policy.MaxLimits/policy.MaxDomains)...))
	if err != nil || set.Len() != policy.MaxDomains {
		t.Fatalf("the largest set within the bounds: %v", err)
	}
}

// heapPeak samples the heap's live and unswept objects every millisecond
// until stop is closed, and returns the largest value seen.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				out <- peak
				return
			case <-tk.C:
			}
		}
	}()
	return out
}

// TestHostileResponses: an xDS server sends responses within the 16 MiB
// message limit but far past the policy set's bounds (3.3 million tiny
// descriptors in one resource: RSS past 8.4 GiB once; 16 MiB over 256
// resources; 10,000 domains of 80 limits: ACKed at 3.2 GiB once). Each is
// NACKed, naming the bound, within hostileTime, with the test process's
// heap (server and client together) within hostileHeap of where it
// started, and the last good set keeps serving.
func TestHostileResponses(t *testing.T) {
	if testing.Short() {
		t.Skip("16 MiB responses")
	}
	const (
		hostileTime = 10 * time.Second // the NACK comes in well under a second; the machine is shared
		hostileHeap = 160 << 20        // the server's copies of the 16 MiB response and gRPC's buffers, then the client's
	)
	srv := xdstest.Start(t, "127.0.0.1:0", "envoy-ratelimit", nil)
	got := newSets()
	c, err := New(Options{ServerURL: srv.Addr, NodeID: "envoy-ratelimit", Apply: got.apply, Backoff: Backoff{Initial: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	good := &rlsconfv3.RateLimitConfig{Name: "good", Domain: "good", Descriptors: []*rlsconfv3.RateLimitDescriptor{limited("a")}}
	srv.Set(t, good)
	got.next(t)

	tiny := &rlsconfv3.RateLimitConfig{Name: "evil", Domain: "evil", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k"}}}
	// 64 KiB resources of 64 descriptors each: the bytes, not the
	// descriptors, pass a bound.
	spread := make([]xdstest.Raw, policy.MaxDomains)
	for i := range spread {
		name := fmt.Sprintf("spread-%d", i)
		spread[i] = xdstest.Raw{Name: name, Wire: xdstest.Repeat(t, &rlsconfv3.RateLimitConfig{Name: name, Domain: name,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", Value: strings.Repeat("v", 1000)}}}, 64)}
	}
	wide := make([]xdstest.Raw, 10_000)
	for i := range wide {
		wide[i] = xdstest.Raw{Name: fmt.Sprintf("wide-%d", i), Wire: xdstest.Repeat(t, &rlsconfv3.RateLimitConfig{Domain: "wide", Descriptors: []*rlsconfv3.RateLimitDescriptor{limited("v")}}, 80)}
	}
	for _, tc := range []struct {
		name string
		raws []xdstest.Raw
		want string
	}{
		{"3.3M descriptors in one resource", []xdstest.Raw{{Name: "evil", Wire: xdstest.Repeat(t, tiny, 3_300_000)}}, "more than the 1048576 (1 MiB) one domain's policy may hold"},
		{"16 MiB over 256 resources", spread, "a policy set may hold"},
		{"10,000 domains x 80 limits", wide, "10000 resources: a policy set holds at most 256 domains"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var size int
			for _, r := range tc.raws {
				size += len(r.Wire)
			}
			reqs, _ := srv.Requests()
			skip := len(reqs)
			runtime.GC()
			stop := make(chan struct{})
			peak := heapPeak(stop)
			base := <-heapPeakOnce()
			start := time.Now()
			srv.SetRaw(t, tc.raws...)
			nack := nackAfter(t, srv, skip, tc.want)
			took := time.Since(start)
			close(stop)
			grew := int64(<-peak) - int64(base)
			t.Logf("%s (%.1f MiB): NACK after %v, heap grew %.1f MiB at most: %.200s", tc.name, float64(size)/(1<<20), took.Round(time.Millisecond),
				float64(grew)/(1<<20), nack.GetErrorDetail().GetMessage())
			if took > hostileTime || grew > hostileHeap {
				t.Errorf("NACK after %v with the heap %d bytes up: want within %v and %d bytes", took, grew, hostileTime, hostileHeap)
			}
			if c.Version() != "1" || got.last().Domain("good") == nil {
				t.Errorf("the last good set is no longer in force: version %q", c.Version())
			}
		})
	}

	// The costliest response within the bounds: four 1 MiB resources of
	// metadata (mappings of 256 keys, the most one may hold). It is ACKed
	// within the same time, and once a small set replaces it the heap is
	// back where it was.
	t.Run("4 MiB of metadata within the bounds", func(t *testing.T) {
		const budget = 320 << 20 // measured: 150 MiB while decoding, the set then holds 40 MiB of Structs
		inner := map[string]any{}
		for i := range policy.MaxMetadataKeys {
			inner[strconv.Itoa(i)] = nil
		}
		var list []any
		for range 380 {
			list = append(list, inner)
		}
		md, err := structpb.NewStruct(map[string]any{"l": list})
		if err != nil {
			t.Fatal(err)
		}
		var cfgs []*rlsconfv3.RateLimitConfig
		for i := range 4 {
			d := limited("v")
			d.Metadata = md
			cfgs = append(cfgs, &rlsconfv3.RateLimitConfig{Name: fmt.Sprint("md-", i), Domain: fmt.Sprint("md-", i), Descriptors: []*rlsconfv3.RateLimitDescriptor{d}})
		}
		runtime.GC()
		base := <-heapPeakOnce()
		stop := make(chan struct{})
		peak := heapPeak(stop)
		start := time.Now()
		srv.Set(t, cfgs...)
		set := got.next(t)
		took := time.Since(start)
		close(stop)
		grew := int64(<-peak) - int64(base)
		t.Logf("%d domains of 1 MiB of metadata: ACK after %v, heap grew %.1f MiB at most", set.Len(), took.Round(time.Millisecond), float64(grew)/(1<<20))
		if set.Len() != 4 || took > hostileTime || grew > budget {
			t.Errorf("%d domains applied after %v with the heap %d bytes up: want 4 within %v and %d bytes", set.Len(), took, grew, hostileTime, budget)
		}
		srv.Set(t, good)
		got.next(t)
		got.mu.Lock()
		got.got = got.got[len(got.got)-1:] // what the client applied before is the test's to forget
		got.mu.Unlock()
		set = nil
		runtime.GC()
		after := <-heapPeakOnce()
		t.Logf("after a 1-domain set replaced them: heap %+.1f MiB from before", float64(int64(after)-int64(base))/(1<<20))
		if int64(after)-int64(base) > 16<<20 {
			t.Errorf("the heap stayed %d bytes above where it was once the large set was replaced", int64(after)-int64(base))
		}
	})
}

// heapPeakOnce reads the heap's objects once.
func heapPeakOnce() <-chan uint64 {
	stop := make(chan struct{})
	close(stop)
	return heapPeak(stop)
}

// nackAfter waits for a NACK holding want among the server's requests
// after the first skip.
func nackAfter(t *testing.T, srv *xdstest.Server, skip int, want string) *discoveryv3.DiscoveryRequest {
	t.Helper()
	deadline := time.After(wait)
	for {
		reqs, changed := srv.Requests()
		for _, r := range reqs[skip:] {
			if strings.Contains(r.GetErrorDetail().GetMessage(), want) {
				return r
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no NACK holding %q among %d requests", want, len(reqs)-skip)
		}
	}
}
