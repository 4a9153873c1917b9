package envoyratelimit

import (
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// controlPlane is the sluice-controlplane binary TestMain builds.
var controlPlane string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(stack.RunWithControlPlane("e2e/envoyratelimit", testing.Short(), &controlPlane, nil, m.Run))
}

// domain is the rate limit domain of the filters and of policy.
const domain = "envoyrl"

// policy is what the control plane serves. Fixed windows of a day (aligned
// to UTC midnight) make the counts exact whatever the test's speed; the
// per-second and per-minute limits are there for X-RateLimit-Reset.
const policy = `
domain: envoyrl
response_headers: true
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: header_match
    value: post
    rate_limit: {name: posts, unit: day, requests_per_unit: 1}
  - key: generic_key
    value: vh
    rate_limit: {name: per_host, unit: day, requests_per_unit: 5}
  - key: generic_key
    value: both
    rate_limit: {name: both, unit: day, requests_per_unit: 2}
  - key: generic_key
    value: persec
    rate_limit: {name: per_second, unit: second, requests_per_unit: 1000}
  - key: generic_key
    value: perminute
    rate_limit: {name: per_minute, unit: minute, requests_per_unit: 1000}
  - key: generic_key
    value: multi
    rate_limit: {name: per_30s, window: 30s, requests_per_unit: 30}
  - key: cost_key
    rate_limit: {name: cost, unit: day, requests_per_unit: 10}
  - key: bucket_key
    rate_limit: {name: bucket, algorithm: token_bucket, unit: hour, requests_per_unit: 10}
  - key: hits_key
    rate_limit: {name: hits, unit: day, requests_per_unit: 10}
  - key: refund_key
    rate_limit: {name: refundable, unit: day, requests_per_unit: 3}
  - key: refund_bucket
    rate_limit: {name: refundable_bucket, algorithm: token_bucket, unit: hour, requests_per_unit: 3}
  - key: generic_key
    value: grpc-open
    rate_limit: {name: grpc_open, unit: day, requests_per_unit: 2}
  - key: generic_key
    value: grpc-deny
    rate_limit: {name: grpc_deny, unit: day, requests_per_unit: 2}
`

// setup is one way of deploying: Envoy's gRPC client, the decision port's
// server and the store.
type setup struct {
	client string // envoy_grpc | google_grpc
	server string // unary | grpc-go
	redis  bool   // a real redis-server, else the memory store
}

func (s setup) String() string {
	st := "memory"
	if s.redis {
		st = "redis"
	}
	return s.client + "/" + s.server + "/" + st
}

// setups are the deployments every scenario runs on.
var setups = []setup{
	{"envoy_grpc", "unary", false},
	{"google_grpc", "unary", false},
	{"envoy_grpc", "grpc-go", false},
	{"envoy_grpc", "unary", true},
	{"google_grpc", "unary", true},
	{"envoy_grpc", "grpc-go", true},
}

// env is one setup running: a control plane (on Redis or not), Envoy with
// two listeners in front of an HTTP and a gRPC upstream.
//
//   - "open": failure_mode_deny false; a rate-limited gRPC call gets
//     UNAVAILABLE (14), Envoy's default;
//   - "deny": failure_mode_deny true and rate_limited_as_resource_exhausted,
//     so a rate-limited gRPC call gets RESOURCE_EXHAUSTED (8).
//
// Both enable X-RateLimit-* headers (DRAFT_VERSION_03) and take a request's
// hits_addend from the x-hits header through the envoy.ratelimit.hits_addend
// filter state.
type env struct {
	cp    *stack.ControlPlane
	envoy *stack.Envoy
	up    *stack.Upstream
}

// start runs s and stops it when the test ends.
func start(t *testing.T, s setup) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	pol := filepath.Join(dir, "envoyrl.yaml")
	if err := os.WriteFile(pol, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := stack.ControlPlaneConfig{Binary: controlPlane, Dir: dir, Policies: []string{pol},
		Args: []string{"-grpc-server", s.server}}
	if s.redis {
		cfg.RedisAddr = redistest.StartServer(t).Addr()
		cfg.Args = append(cfg.Args, "-deadline", "500ms") // two busy cores: no degrading mid-count
	}
	cp, err := stack.StartControlPlane(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cp.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(cp.LogPath())
			t.Logf("the control plane's log (%s):\n%s", cp.LogPath(), lastLines(string(b), 30))
		}
	})

	up, err := stack.StartUpstream("127.0.0.1:0", "x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(ctx) })
	grpcUp := startGRPCUpstream(t)

	boot := stack.Bootstrap(
		[]stack.M{listener("open", s.client, cp.GRPCAddr(), false), listener("deny", s.client, cp.GRPCAddr(), true)},
		[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster("grpcup", grpcUp), stack.GRPCCluster("rls", cp.GRPCAddr())})
	e := startEnvoy(t, ctx, stack.EnvoyConfig{Dir: dir, Bootstrap: boot,
		// The filter logs why a call failed at debug.
		Args: []string{"--component-log-level", "filter:debug"}})
	return &env{cp: cp, envoy: e, up: up}
}

// startGRPCUpstream serves grpc.health.v1.Health on a loopback port until
// the test ends and returns its address.
func startGRPCUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// listener returns the listener name (see env) with Envoy's ratelimit filter
// calling the control plane at rls through client.
func listener(name, client, rls string, deny bool) stack.M {
	svc := stack.M{"timeout": "1s"}
	switch client {
	case "envoy_grpc":
		svc["envoy_grpc"] = stack.M{"cluster_name": "rls"}
	case "google_grpc":
		svc["google_grpc"] = stack.M{"target_uri": rls, "stat_prefix": "rls"}
	}
	rl := stack.RateLimitFilter(domain, "rls", stack.M{
		// The filter's own timeout bounds the call (default 20 ms; the
		// grpc_service's does not lift it). The first call on Redis can take
		// longer on two busy cores.
		"timeout":                            "1s",
		"failure_mode_deny":                  deny,
		"rate_limited_as_resource_exhausted": deny,
		"enable_x_ratelimit_headers":         "DRAFT_VERSION_03",
	})
	rl["typed_config"].(stack.M)["rate_limit_service"].(stack.M)["grpc_service"] = svc
	hits := stack.M{
		"name": "envoy.filters.http.set_filter_state",
		"typed_config": stack.M{
			"@type": "type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config",
			"on_request_headers": []stack.M{{
				"object_key": "envoy.ratelimit.hits_addend",
				"format_string": stack.M{
					"text_format_source": stack.M{"inline_string": "%REQ(x-hits)%"},
					"omit_empty_values":  true,
				},
				"skip_if_empty": true,
			}},
		},
	}
	return stack.HTTPListener(name, 0, []stack.M{virtualHost(name)}, hits, rl)
}

// virtualHost returns the routes of listener name (see the scenarios).
// The virtual host's own rate_limits apply to routes without any (Envoy's
// default, vh_rate_limits OVERRIDE) and, through the per-route INCLUDE, to
// /both.
func virtualHost(name string) stack.M {
	vh := stack.VirtualHost("all",
		limited("/key", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "api_key"}}),
		limited("/addr", stack.M{"remote_address": stack.M{}}),
		limited("/post", stack.M{"header_value_match": stack.M{
			"descriptor_value": "post",
			"headers":          []stack.M{{"name": ":method", "string_match": stack.M{"exact": "POST"}}},
		}}),
		limited("/sec", genericKey("persec")),
		limited("/min", genericKey("perminute")),
		limited("/multi", genericKey("multi")),
		withHitsAddend(limited("/cost", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "cost_key"}})),
		withHitsAddend(limited("/bucket", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "bucket_key"}})),
		limited("/hits", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "hits_key"}}),
		limited("/refundable/window", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "refund_key"}}),
		limited("/refundable/bucket", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "refund_bucket"}}),
		refunding(limited("/refund/window", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "refund_key"}})),
		refunding(limited("/refund/bucket", stack.M{"request_headers": stack.M{"header_name": "x-api-key", "descriptor_key": "refund_bucket"}})),
		includeVH(limited("/both", genericKey("both"))),
		grpcRoute(limited("/grpc.health.v1.Health/", genericKey("grpc-"+name))),
		stack.RouteTo("/vh", "up"),
	)
	vh["rate_limits"] = []stack.M{{"actions": []stack.M{genericKey("vh")}}}
	return vh
}

// limited returns a route of prefix to the HTTP upstream whose rate_limits
// entry has the one action.
func limited(prefix string, action stack.M) stack.M {
	r := stack.RouteTo(prefix, "up")
	r["route"].(stack.M)["rate_limits"] = []stack.M{{"actions": []stack.M{action}}}
	return r
}

// genericKey returns a generic_key action with value v.
func genericKey(v string) stack.M {
	return stack.M{"generic_key": stack.M{"descriptor_value": v}}
}

// withHitsAddend moves route r's rate_limits into the filter's per-route
// configuration, with each request costing the x-cost header's value: the
// per-descriptor hits_addend (Envoy 1.33+). Envoy reads hits_addend only
// there: the route's own rate_limits ignore it.
func withHitsAddend(r stack.M) stack.M {
	route := r["route"].(stack.M)
	rl := route["rate_limits"].([]stack.M)
	delete(route, "rate_limits")
	rl[0]["hits_addend"] = stack.M{"format": "%REQ(x-cost)%"}
	r["typed_per_filter_config"] = stack.M{"envoy.filters.http.ratelimit": stack.M{
		"@type":       "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
		"rate_limits": rl,
	}}
	return r
}

// refunding makes route r give back, rather than take, the x-refund
// header's value: its rate_limits entry's hits_addend with
// is_negative_hits (Envoy 1.38+), in the filter's per-route configuration
// as for withHitsAddend.
func refunding(r stack.M) stack.M {
	r = withHitsAddend(r)
	rl := r["typed_per_filter_config"].(stack.M)["envoy.filters.http.ratelimit"].(stack.M)["rate_limits"].([]stack.M)
	rl[0]["hits_addend"] = stack.M{"format": "%REQ(x-refund)%", "is_negative_hits": true}
	return r
}

// includeVH makes route r also apply its virtual host's rate_limits.
func includeVH(r stack.M) stack.M {
	r["typed_per_filter_config"] = stack.M{"envoy.filters.http.ratelimit": stack.M{
		"@type":          "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
		"vh_rate_limits": "INCLUDE",
	}}
	return r
}

// grpcRoute sends route r to the gRPC upstream.
func grpcRoute(r stack.M) stack.M {
	r["route"].(stack.M)["cluster"] = "grpcup"
	return r
}

// startEnvoy starts Envoy with cfg and stops it when the test ends; if the
// test failed, the end of Envoy's log is logged first.
func startEnvoy(t *testing.T, ctx context.Context, cfg stack.EnvoyConfig) *stack.Envoy {
	t.Helper()
	e, err := stack.StartEnvoy(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Envoy's log (%s):\n%s", e.LogPath(), e.LogExcerpt())
		}
		e.Stop()
	})
	return e
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	end := len(s)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			n--
			if n < 0 {
				return s[i+1 : end]
			}
		}
	}
	return s
}
