package xdsconfig

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/internal/testcerts"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// wait bounds each wait for something the client does; generous, since the
// machine is shared.
const wait = 20 * time.Second

// sets records what the client applies.
type sets struct {
	mu  sync.Mutex
	got []*policy.Set
	ch  chan struct{}
}

func newSets() *sets { return &sets{ch: make(chan struct{}, 100)} }

func (s *sets) apply(set *policy.Set) {
	s.mu.Lock()
	s.got = append(s.got, set)
	s.mu.Unlock()
	s.ch <- struct{}{}
}

func (s *sets) last() *policy.Set {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[len(s.got)-1]
}

// next waits for the next applied set.
func (s *sets) next(t *testing.T) *policy.Set {
	t.Helper()
	select {
	case <-s.ch:
		return s.last()
	case <-time.After(wait):
		t.Fatal("no configuration applied")
		return nil
	}
}

// request waits for a request from the client that satisfies ok.
func request(t *testing.T, srv *xdstest.Server, ok func(*discoveryv3.DiscoveryRequest) bool) *discoveryv3.DiscoveryRequest {
	t.Helper()
	deadline := time.After(wait)
	for {
		reqs, changed := srv.Requests()
		for _, r := range reqs {
			if ok(r) {
				return r
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no such request among %d", len(reqs))
		}
	}
}

func limitOf(set *policy.Set, domain string) int64 {
	d := set.Domain(domain)
	if d == nil {
		return -1
	}
	l := d.Match([]policy.Entry{{Key: "r", Value: "r"}, {Key: "rule-0-match--1", Value: "rule-0-match--1"}})
	if len(l) != 1 {
		return -1
	}
	return l[0].Requests
}

func cfg(domain string, n uint32) *rlsconfv3.RateLimitConfig {
	return xdstest.Config(domain, xdstest.RouteDescriptor("r", xdstest.Rule{Requests: n, Unit: rlsconfv3.RateLimitUnit_HOUR}))
}

// mtls returns the xDS server's mutual-TLS configuration and the client's,
// which names the server "sluice.test" whatever address it dials (as
// CONFIG_GRPC_XDS_SERVER_TLS_SAN does).
func mtls(t *testing.T, serverName string) (server, client *tls.Config) {
	pki := testcerts.New(t)
	cert, err := tls.LoadX509KeyPair(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pki.CA.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	client = pki.ClientTLS(t)
	client.ServerName = serverName
	return server, client
}

// TestClientFollowsServer: over mutual TLS, the first snapshot is applied
// and ACKed, a new one replaces it, an invalid one is NACKed naming the
// resource and field while the last good set stays, and after the server
// restarts the client subscribes again and takes its state.
func TestClientFollowsServer(t *testing.T) {
	stc, ctc := mtls(t, "sluice.test")
	srv := xdstest.Start(t, "127.0.0.1:0", "envoy-ratelimit", stc)
	v1 := srv.Set(t, cfg("default/eg/http", 3))
	got := newSets()
	c, err := New(Options{ServerURL: srv.Addr, NodeID: "envoy-ratelimit", TLS: ctc, Apply: got.apply,
		Backoff: Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if n := limitOf(got.next(t), "default/eg/http"); n != 3 {
		t.Fatalf("first snapshot: limit %d, want 3", n)
	}
	request(t, srv, func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetVersionInfo() == v1 && r.GetErrorDetail() == nil && r.GetNode().GetId() == "envoy-ratelimit"
	})
	select {
	case <-c.Loaded():
	default:
		t.Error("Loaded not closed after the first ACK")
	}

	v2 := srv.Set(t, cfg("default/eg/http", 5), cfg("default/shared", 7))
	set := got.next(t)
	if limitOf(set, "default/eg/http") != 5 || limitOf(set, "default/shared") != 7 {
		t.Fatalf("second snapshot not applied whole: %v", domainsOf(set))
	}
	request(t, srv, func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetVersionInfo() == v2 && r.GetErrorDetail() == nil
	})

	bad := cfg("default/eg/http", 9)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	v3 := srv.Set(t, bad)
	nack := request(t, srv, func(r *discoveryv3.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack.GetVersionInfo() != v2 {
		t.Errorf("NACK of %s carries version %q, want the last good %q", v3, nack.GetVersionInfo(), v2)
	}
	for _, w := range []string{`resource "default/eg/http"`, "descriptors[0].descriptors[0].rate_limit.unit"} {
		if !strings.Contains(nack.GetErrorDetail().GetMessage(), w) {
			t.Errorf("error_detail %q does not name %q", nack.GetErrorDetail().GetMessage(), w)
		}
	}
	if limitOf(got.last(), "default/eg/http") != 5 || c.Version() != v2 {
		t.Errorf("after the NACK the set changed (version %q)", c.Version())
	}

	// Restart: a new server on the same address, with a version string the
	// old one already used for other contents.
	addr := srv.Addr
	srv.Stop()
	srv2 := xdstest.Start(t, addr, "envoy-ratelimit", stc)
	srv2.SetVersion(t, v2, cfg("default/eg/http", 11))
	if n := limitOf(got.next(t), "default/eg/http"); n != 11 {
		t.Fatalf("after the restart: limit %d, want 11", n)
	}
}

// TestClientRefusesWrongServerName: the server's certificate must hold the
// name the client expects (here "envoy-gateway", which the test
// certificate does not hold): nothing is applied.
func TestClientRefusesWrongServerName(t *testing.T) {
	stc, ctc := mtls(t, "envoy-gateway")
	srv := xdstest.Start(t, "127.0.0.1:0", "envoy-ratelimit", stc)
	srv.Set(t, cfg("d", 3))
	got := newSets()
	c, err := New(Options{ServerURL: srv.Addr, NodeID: "envoy-ratelimit", TLS: ctc, Apply: got.apply,
		Backoff: Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Run(ctx)
	if len(got.got) != 0 {
		t.Fatal("a configuration was applied from a server with the wrong name")
	}
}

func domainsOf(set *policy.Set) []string {
	var out []string
	for _, d := range set.Domains() {
		out = append(out, d.Name)
	}
	return out
}

// TestClientBoundsResponses: a response over MaxMsgSize is refused before it
// is read (the stream fails and is reopened), and the last good set keeps
// serving.
func TestClientBoundsResponses(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0", "n", nil)
	srv.Set(t, cfg("d", 3))
	got := newSets()
	c, err := New(Options{ServerURL: srv.Addr, NodeID: "n", Apply: got.apply, MaxMsgSize: 64 << 10,
		Backoff: Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if limitOf(got.next(t), "d") != 3 {
		t.Fatal("first snapshot not applied")
	}
	big := cfg("d", 5)
	for i := range 4000 {
		big.Descriptors = append(big.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("padding-key-%06d", i),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1}})
	}
	reqs, _ := srv.Requests()
	srv.Set(t, big)
	// The stream breaks and is reopened: two more subscriptions (requests
	// without a nonce) arrive.
	request(t, srv, func(*discoveryv3.DiscoveryRequest) bool {
		now, _ := srv.Requests()
		subs := 0
		for _, r := range now[len(reqs):] {
			if r.GetResponseNonce() == "" {
				subs++
			}
		}
		return subs >= 2
	})
	got.mu.Lock()
	applied := len(got.got)
	got.mu.Unlock()
	if n := limitOf(got.last(), "d"); n != 3 || applied != 1 {
		t.Fatalf("after an oversized response: %d sets applied, limit %d; want the first kept", applied, n)
	}
}
