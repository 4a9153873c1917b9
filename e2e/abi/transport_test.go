package abi

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/testcerts"
)

// transportPolicy limits each api_key to 3 an hour.
const transportPolicy = `
domain: abi
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 3}
`

// tlsGRPCCluster is stack.GRPCCluster over TLS to a server with a
// certificate for localhost signed by caFile, presenting the client
// certificate certFile when it is set.
func tlsGRPCCluster(name, addr, caFile, certFile, keyFile string) stack.M {
	common := stack.M{"validation_context": stack.M{"trusted_ca": stack.M{"filename": caFile}}}
	if certFile != "" {
		common["tls_certificates"] = []stack.M{{
			"certificate_chain": stack.M{"filename": certFile},
			"private_key":       stack.M{"filename": keyFile},
		}}
	}
	c := stack.GRPCCluster(name, addr)
	c["transport_socket"] = stack.M{
		"name": "envoy.transport_sockets.tls",
		"typed_config": stack.M{
			"@type":              "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
			"sni":                "localhost",
			"common_tls_context": common,
		},
	}
	return c
}

// TestTransports runs the filter's two transports, proxy_http_call and
// proxy_grpc_call, in real Envoy against a control plane whose decision
// port wants mTLS, and expects the same behaviour of both: decisions over
// TLS (admitted with RateLimit headers, then the control plane's 429); a
// cluster without the client certificate gets no answer, and the failure
// mode decides at once; a hung control plane (SIGSTOP) gets the failure
// mode at the plugin's timeout, not before.
//
// The native module has no gRPC client of Envoy's to call with: its
// transport "grpc" is its HTTP callout too, and must behave the same.
func TestTransports(t *testing.T) {
	progs, _ := programs(t)
	stack.ForEachFilter(t, progs.Filters, func(t *testing.T, f stack.Filter) { transportsOn(t, progs, f) })
}

// transportsOn is TestTransports on filter f.
func transportsOn(t *testing.T, progs stack.Programs, f stack.Filter) {
	ctx := context.Background()
	dir := t.TempDir()
	certs := testcerts.New(t)
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: progs.ControlPlane, Dir: dir,
		Policies: []string{policyFile(t, dir, transportPolicy)},
		Args: []string{"-grpc-tls-cert", certs.ServerCert, "-grpc-tls-key", certs.ServerKey,
			"-grpc-client-ca", certs.CA.File}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(context.Background()) })

	const timeout = 400 * time.Millisecond
	route := []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))}
	var listeners []stack.M
	for _, transport := range []string{"http", "grpc"} {
		for _, cluster := range []string{"mtls", "nocert"} {
			pc := stack.PluginConfig{Cluster: cluster, Transport: transport, Domain: "abi", Timeout: timeout.String(),
				FailureMode: "open",
				RateLimits:  []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-api-key", "api_key")}}},
				Precheck:    &stack.Precheck{Enabled: false},
				Headers:     &stack.Headers{Draft10: true, RetryAfter: true, FailureMode: true}}
			name := transport + "-" + cluster
			listeners = append(listeners, stack.HTTPListener(name, 0, route, hostFilter(f, name, pc.JSON())))
		}
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Concurrency: 1, Bootstrap: stack.Bootstrap(listeners,
		[]stack.M{stack.Cluster("up", up.Addr()),
			tlsGRPCCluster("mtls", cp.GRPCAddr(), certs.CA.File, certs.ClientCert, certs.ClientKey),
			tlsGRPCCluster("nocert", cp.GRPCAddr(), certs.CA.File, "", "")})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy log:\n%s", e.LogExcerpt())
		}
		e.Stop()
	})
	client := &http.Client{Timeout: 30 * time.Second}
	timed := func(url, key string) (answer, time.Duration) {
		start := time.Now()
		a := get(t, client, url, "x-api-key", key)
		return a, time.Since(start)
	}

	for _, transport := range []string{"http", "grpc"} {
		mtls, nocert := e.URL(transport+"-mtls")+"/", e.URL(transport+"-nocert")+"/"
		key := "k-" + transport
		for i := range 3 {
			a := get(t, client, mtls, "x-api-key", key)
			if a.code != 200 || !strings.HasPrefix(a.header.Get("RateLimit"), `"per_key";r=`+string(rune('2'-i))+`;`) {
				t.Fatalf("%s: request %d: %d, RateLimit %q", transport, i+1, a.code, a.header.Get("RateLimit"))
			}
		}
		if a := get(t, client, mtls, "x-api-key", key); a.code != 429 || a.header.Get("Retry-After") == "" {
			t.Fatalf("%s: fourth request: %d, Retry-After %q", transport, a.code, a.header.Get("Retry-After"))
		}
		before := counters(t, e)
		a, took := timed(nocert, key)
		after := counters(t, e)
		if a.code != 200 || a.header.Get("X-Sluice-Failure-Mode") != "open" ||
			after[f.Stat("sluice.failure_open")] != before[f.Stat("sluice.failure_open")]+1 {
			t.Errorf("%s without a client certificate: %d, failure mode %q, failure_open %d -> %d", transport, a.code,
				a.header.Get("X-Sluice-Failure-Mode"), before[f.Stat("sluice.failure_open")], after[f.Stat("sluice.failure_open")])
		}
		t.Logf("%s: the call without a client certificate failed open in %v", transport, took.Round(time.Millisecond))
	}

	// Hung: every call waits for the timeout, then fails open.
	if err := cp.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer cp.Thaw()
	for _, transport := range []string{"http", "grpc"} {
		before := counters(t, e)
		a, took := timed(e.URL(transport+"-mtls")+"/", "hung-"+transport)
		after := counters(t, e)
		if a.code != 200 || a.header.Get("X-Sluice-Failure-Mode") != "open" || took < timeout*9/10 ||
			after["cluster.mtls.upstream_rq_timeout"] != before["cluster.mtls.upstream_rq_timeout"]+1 {
			t.Errorf("%s, control plane hung: %d, failure mode %q after %v (timeout %v), upstream_rq_timeout %d -> %d",
				transport, a.code, a.header.Get("X-Sluice-Failure-Mode"), took, timeout,
				before["cluster.mtls.upstream_rq_timeout"], after["cluster.mtls.upstream_rq_timeout"])
		}
		t.Logf("%s: the hung call failed open after %v (timeout %v)", transport, took.Round(time.Millisecond), timeout)
	}
	// Each transport's warning says the call timed out.
	if n := strings.Count(e.Log(), "raise the plugin's timeout (now 400ms)"); n != 2 {
		t.Errorf("%d warnings of a timeout in Envoy's log, want 2 (one per transport)", n)
	}
}
