package abi

import (
	"context"
	"net/http"
	"regexp"
	"testing"

	"github.com/sluicehq/sluice/e2e/stack"
)

// headersPolicy advertises its limits (response_headers), so the control
// plane's answers carry RateLimit headers of their own: the filter must not
// pass them on next to its own. The api_key limit has no name: its header
// name is its ID, api_key#0.
const headersPolicy = `
domain: abi
response_headers: true
descriptors:
  - key: remote_address
    rate_limit: {name: per_address, unit: minute, requests_per_unit: 1000}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// headerNames are the headers each answer must carry at most once.
var headerNames = []string{"RateLimit-Policy", "RateLimit", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// wantHeaders checks that each rate limit header appears as often as want
// says (absent: 0) and, when want gives a pattern, matches it.
func wantHeaders(t *testing.T, path string, a answer, want map[string]string) {
	t.Helper()
	for _, h := range headerNames {
		vs := a.header.Values(h)
		pat, ok := want[h]
		switch {
		case !ok && len(vs) != 0:
			t.Errorf("%s: %s = %q, want none", path, h, vs)
		case ok && len(vs) != 1:
			t.Errorf("%s: %s = %q, want one value", path, h, vs)
		case ok && !regexp.MustCompile("^"+pat+"$").MatchString(vs[0]):
			t.Errorf("%s: %s = %q, want %s", path, h, vs[0], pat)
		}
	}
}

// TestHeaders checks the rate limit headers on every path a request can
// take through the filter in Envoy: each header at most once, one naming
// rule (a limit without a name is called by its ID, api_key#0, by the
// control plane and by the filter alike).
//
// Listener "cp" has the precheck off, so the control plane decides every
// request there; listener "pre" has it on, and only the api_key descriptor,
// and fails closed.
//
// On each host.
func TestHeaders(t *testing.T) {
	progs, _ := programs(t)
	stack.ForEachFilter(t, progs.Filters, func(t *testing.T, f stack.Filter) { headersOn(t, progs, f) })
}

// headersOn is TestHeaders on filter f.
func headersOn(t *testing.T, progs stack.Programs, f stack.Filter) {
	ctx := context.Background()
	dir := t.TempDir()
	cp, up := backends(t, ctx, progs, dir, headersPolicy)

	headers := &stack.Headers{Draft10: true, RetryAfter: true, FailureMode: true}
	viaCP := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "2s", FailureMode: "open",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RemoteAddress()}},
			{Actions: []stack.Action{stack.RequestHeader("x-api-key", "api_key")}}},
		Precheck: &stack.Precheck{Enabled: false}, Headers: headers}
	prechecked := stack.PluginConfig{Cluster: stack.DefaultCluster, Domain: "abi", Timeout: "2s", FailureMode: "closed",
		RateLimits: []stack.RateLimit{{Actions: []stack.Action{stack.RequestHeader("x-api-key", "api_key")}}},
		Precheck:   &stack.Precheck{Enabled: true}, Headers: headers}
	route := []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Concurrency: 1, Bootstrap: stack.Bootstrap(
		[]stack.M{
			stack.HTTPListener("cp", 0, route, hostFilter(f, "cp", viaCP.JSON())),
			stack.HTTPListener("pre", 0, route, hostFilter(f, "pre", prechecked.JSON())),
		},
		[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())})})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	client := &http.Client{}
	cpURL, preURL := e.URL("cp")+"/", e.URL("pre")+"/"

	// Control plane allows: the filter's headers, both limits.
	a := get(t, client, cpURL, "x-api-key", "k1")
	if a.code != 200 {
		t.Fatalf("first request: %d", a.code)
	}
	wantHeaders(t, "control plane allows", a, map[string]string{
		"RateLimit-Policy": `"per_address";q=1000;w=60, "api_key#0";q=3;w=3600`,
		"RateLimit":        `"per_address";r=999;t=\d+, "api_key#0";r=2;t=\d+`,
	})

	// Control plane rejects the fourth request of k1 (the precheck is off).
	get(t, client, cpURL, "x-api-key", "k1")
	get(t, client, cpURL, "x-api-key", "k1")
	before := counters(t, e)
	a = get(t, client, cpURL, "x-api-key", "k1")
	after := counters(t, e)
	if a.code != 429 || after[f.Stat("sluice.over_limit")] != before[f.Stat("sluice.over_limit")]+1 {
		t.Fatalf("fourth request: %d, over_limit %d -> %d", a.code, before[f.Stat("sluice.over_limit")], after[f.Stat("sluice.over_limit")])
	}
	wantHeaders(t, "control plane rejects", a, map[string]string{
		"RateLimit-Policy": `"per_address";q=1000;w=60, "api_key#0";q=3;w=3600`,
		"RateLimit":        `"per_address";r=99\d;t=\d+, "api_key#0";r=0;t=\d+`,
		"Retry-After":      `[1-9]\d*`,
	})

	// The precheck rejects k2 once the control plane said it is over.
	var pre answer
	for i := range 20 {
		before := counters(t, e)[f.Stat("sluice.precheck_rejected")]
		a := get(t, client, preURL, "x-api-key", "k2")
		t.Logf("k2 request %d: %d, precheck_rejected %d -> %d", i+1, a.code, before, counters(t, e)[f.Stat("sluice.precheck_rejected")])
		if counters(t, e)[f.Stat("sluice.precheck_rejected")] == before+1 {
			if a.code != 429 {
				t.Fatalf("precheck rejection answered %d", a.code)
			}
			pre = a
			break
		}
		if i < 3 && a.code != 200 {
			t.Fatalf("request %d of k2: %d", i+1, a.code)
		}
	}
	if pre.code == 0 {
		t.Fatal("the precheck rejected none of 20 requests over a limit of 3")
	}
	wantHeaders(t, "precheck rejects", pre, map[string]string{
		"RateLimit-Policy": `"api_key#0";q=3;w=3600`,
		"RateLimit":        `"api_key#0";r=0;t=\d+`,
		"Retry-After":      `[1-9]\d*`,
	})

	// Every decision was a call over HTTP on the control-plane cluster,
	// and every admitted request was resumed on to the upstream.
	s := counters(t, e)
	calls := s[f.Stat("sluice.allowed")] + s[f.Stat("sluice.over_limit")]
	if n := s["cluster."+stack.DefaultCluster+".upstream_rq_200"]; n != calls {
		t.Errorf("cluster %s: %d calls answered, the filter counted %d decisions", stack.DefaultCluster, n, calls)
	}
	if n := up.Total(); n != s[f.Stat("sluice.allowed")] {
		t.Errorf("the upstream saw %d requests, the control plane allowed %d", n, s[f.Stat("sluice.allowed")])
	}

	// The control plane is down: failure modes, no rate limit headers. On
	// "cp" the policy said remote_address fails open; on "pre" a key never
	// seen takes the plugin's failure_mode, closed.
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	before = counters(t, e)
	a = get(t, client, cpURL, "x-api-key", "k3")
	if a.code != 200 {
		t.Errorf("failing open: %d", a.code)
	}
	wantHeaders(t, "failure mode open", a, nil)
	if v := a.header.Values("X-Sluice-Failure-Mode"); len(v) != 1 || v[0] != "open" {
		t.Errorf("failing open: x-sluice-failure-mode = %q, want open (headers.failure_mode)", v)
	}
	a = get(t, client, preURL, "x-api-key", "k4")
	if a.code != 500 {
		t.Errorf("failing closed: %d", a.code)
	}
	wantHeaders(t, "failure mode closed", a, nil)
	if v := a.header.Values("X-Sluice-Failure-Mode"); len(v) != 1 || v[0] != "closed" {
		t.Errorf("failing closed: x-sluice-failure-mode = %q, want closed (headers.failure_mode)", v)
	}
	after = counters(t, e)
	for _, c := range []string{"errors", "failure_open", "failure_closed"} {
		want := int64(1)
		if c == "errors" {
			want = 2
		}
		if d := after[f.Stat("sluice."+c)] - before[f.Stat("sluice."+c)]; d != want {
			t.Errorf("%s went up by %d, want %d", f.Stat("sluice."+c), d, want)
		}
	}
}
