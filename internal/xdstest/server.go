// Package xdstest serves RateLimitConfig resources over ADS for tests, the
// way Envoy Gateway's global rate limit runner does: go-control-plane's
// SnapshotCache behind a grpc-go server (over mutual TLS when given one),
// one snapshot per node id. It also builds resources shaped like Envoy
// Gateway's translation of BackendTrafficPolicy rules (eg.go).
package xdstest

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TypeURL is RateLimitConfig's type URL.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Server is a running xDS server.
type Server struct {
	// Addr is the listen address (host:port).
	Addr string

	cache  cachev3.SnapshotCache
	grpc   *grpc.Server
	nodeID string

	mu       sync.Mutex
	version  int
	requests []*discoveryv3.DiscoveryRequest
	changed  chan struct{}
}

// Start serves on addr ("127.0.0.1:0" for a free port; a fixed address to
// restart a server where it was) for nodeID, over TLS when tc is set. The
// server stops at the end of the test.
func Start(t testing.TB, addr, nodeID string, tc *tls.Config) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), nodeID: nodeID, changed: make(chan struct{})}
	s.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.grpc = grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
		s.mu.Lock()
		s.requests = append(s.requests, proto.Clone(req).(*discoveryv3.DiscoveryRequest))
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		return nil
	}}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(context.Background(), s.cache, cb))
	go s.grpc.Serve(ln)
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the server, cutting its streams.
func (s *Server) Stop() { s.grpc.Stop() }

// Set publishes a new snapshot holding cfgs and returns its version, a
// counter from "1" as Envoy Gateway's.
func (s *Server) Set(t testing.TB, cfgs ...*rlsconfv3.RateLimitConfig) string {
	t.Helper()
	return s.SetVersion(t, "", cfgs...)
}

// SetVersion is Set with an explicit version ("" for the next counter
// value).
func (s *Server) SetVersion(t testing.TB, version string, cfgs ...*rlsconfv3.RateLimitConfig) string {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	return s.setResources(t, version, res)
}

// setResources publishes res under version ("" for the next counter
// value) and returns the version.
func (s *Server) setResources(t testing.TB, version string, res []types.Resource) string {
	t.Helper()
	s.mu.Lock()
	s.version++
	if version == "" {
		version = strconv.Itoa(s.version)
	}
	s.mu.Unlock()
	snap, err := cachev3.NewSnapshot(version, map[string][]types.Resource{TypeURL: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), s.nodeID, snap); err != nil {
		t.Fatal(err)
	}
	return version
}

// Raw is a resource given as its wire bytes: a RateLimitConfig as no
// well-behaved server would marshal it (too large, too deep, malformed),
// for the client's bounds to be tested against, served without building
// it (3 million descriptors as structs would weigh far more than the
// client's bound).
type Raw struct {
	Name string // the resource's name in the snapshot (its config's own name, if any, is in Wire)
	Wire []byte // the RateLimitConfig's wire bytes
}

// rawResource serves Raw: an Empty whose unknown fields are the bytes,
// which proto.Marshal writes back as they are.
type rawResource struct {
	*emptypb.Empty
	name string
}

func (r rawResource) GetName() string { return r.name }

// SetRaw publishes a snapshot of raw resources and returns its version.
func (s *Server) SetRaw(t testing.TB, raws ...Raw) string {
	t.Helper()
	res := make([]types.Resource, len(raws))
	for i, r := range raws {
		e := &emptypb.Empty{}
		e.ProtoReflect().SetUnknown(r.Wire)
		res[i] = rawResource{e, r.Name}
	}
	return s.setResources(t, "", res)
}

// Requests returns the requests received so far (the subscriptions, ACKs
// and NACKs), and a channel closed at the next one.
func (s *Server) Requests() ([]*discoveryv3.DiscoveryRequest, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), s.requests...), s.changed
}

// Repeat returns the wire bytes of cfg with its descriptors written n times
// over: a response far larger than any real one, built without holding n
// times the descriptors as structs.
func Repeat(t testing.TB, cfg *rlsconfv3.RateLimitConfig, n int) []byte {
	t.Helper()
	head, err := proto.Marshal(&rlsconfv3.RateLimitConfig{Name: cfg.GetName(), Domain: cfg.GetDomain()})
	if err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(&rlsconfv3.RateLimitConfig{Descriptors: cfg.GetDescriptors()})
	if err != nil {
		t.Fatal(err)
	}
	return append(head, bytes.Repeat(body, n)...)
}

// Wide returns domains configurations "wide-<i>", each with limits
// descriptors key=user, value=u-<j> of a limit of their own (j a minute):
// Wide(256, 39) is about the largest set the policy bounds allow.
func Wide(domains, limits int) []*rlsconfv3.RateLimitConfig {
	out := make([]*rlsconfv3.RateLimitConfig, domains)
	for i := range out {
		c := &rlsconfv3.RateLimitConfig{Name: "wide-" + strconv.Itoa(i), Domain: "wide-" + strconv.Itoa(i)}
		for j := range limits {
			c.Descriptors = append(c.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "user", Value: "u-" + strconv.Itoa(j),
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: uint32(j + 1)}})
		}
		out[i] = c
	}
	return out
}
