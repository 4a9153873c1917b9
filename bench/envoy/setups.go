package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// load is how wrk picks each request's x-user header.
type load string

const (
	loadSpread  load = "spread"  // 10,000 keys, each well under its limit
	loadFlood   load = "flood"   // 90% on key "hot" (100/s, at least 10x over), the rest spread
	loadBlocked load = "blocked" // every request on key "blocked" (1 an hour): over its limit
	loadSteady  load = "steady"  // 10 keys, each well under its limit (what leases are for)
	loadUnique  load = "unique"  // a key no other request uses (what leases cannot help at all)
)

// rls is the rate limit service a setup calls.
type rls int

const (
	rlsNone         rls = iota
	rlsPeer             // envoyproxy/ratelimit on Redis
	rlsSluice           // sluice-controlplane on Redis
	rlsSluiceMemory     // sluice-controlplane on its memory store (setup 4: only the first answers matter)
	rlsSluiceLease      // sluice-controlplane on Redis, the policy with lease: auto
	rlsFloor            // controlplane/cmd/rlsfloor: sluice's decision port answering a fixed answer (no decision, no Redis)
)

// setup is one row of the table.
type setup struct {
	id, name    string
	filter      func(b *built) []stack.M // HTTP filters before the router
	routeLimits bool                     // route rate_limits for Envoy's ratelimit filter
	direct      bool                     // the ingress route answers 429 itself (no upstream)
	rls         rls
	load        load // the setup's one load; "" for setups 5-7, which run every -loads
	usage       bool // the backend reports usageTokens per request in usageHeader
	// adds is a response header the setup's filter adds to an admitted
	// request's response: measure checks that it does before measuring.
	adds string
	// The LLM setups (llm.go): a POST of a chat request body of this many
	// bytes, answered with a JSON answer with usage; or an answer streamed
	// as SSE by the Go backend.
	body int
	sse  bool
}

var setups = map[string]setup{
	"1": {id: "1", name: "Envoy, no rate limit filter (the floor)", load: loadSpread},
	"1d": {id: "1d", name: "Envoy, no filter, route answers 429 itself (floor of a local reply)",
		direct: true, load: loadBlocked},
	"2": {id: "2", name: "Envoy, empty upstream-Go Wasm filter (Continue)", load: loadSpread,
		filter: func(b *built) []stack.M { return []stack.M{wasmFilter(b.emptyWasm, []byte("{}"))} }},
	"2r": {id: "2r", name: "Envoy, empty Go filter making a precheck rejection's host calls (floor of a Wasm 429)",
		load:   loadBlocked,
		filter: func(b *built) []stack.M { return []stack.M{wasmFilter(b.emptyWasm, []byte(`{"reply":true}`))} }},
	"2h": {id: "2h", name: "Envoy, empty Go filter making sluice's callout over proxy_http_call, sluice-controlplane, Redis (callout floor)",
		load: loadSpread, rls: rlsSluice,
		filter: func(b *built) []stack.M { return []stack.M{wasmFilter(b.emptyWasm, []byte(`{"callout":"http"}`))} }},
	"2g": {id: "2g", name: "Envoy, empty Go filter making sluice's callout over proxy_grpc_call, sluice-controlplane, Redis (callout floor)",
		load: loadSpread, rls: rlsSluice,
		filter: func(b *built) []stack.M { return []stack.M{wasmFilter(b.emptyWasm, []byte(`{"callout":"grpc"}`))} }},
	"2hr": {id: "2hr", name: "2h, reading the answer (:status, grpc-status, body)",
		load: loadSpread, rls: rlsSluice,
		filter: func(b *built) []stack.M {
			return []stack.M{wasmFilter(b.emptyWasm, []byte(`{"callout":"http","read":true}`))}
		}},
	"2gr": {id: "2gr", name: "2g, reading the answer (the message)",
		load: loadSpread, rls: rlsSluice,
		filter: func(b *built) []stack.M {
			return []stack.M{wasmFilter(b.emptyWasm, []byte(`{"callout":"grpc","read":true}`))}
		}},
	"2ne": {id: "2ne", name: "Envoy, empty native Go module (Continue): the Go runtime and dynmod's crossings", load: loadSpread,
		filter: func(*built) []stack.M { return []stack.M{floorModule("{}")} }},
	"2nc": {id: "2nc", name: "Envoy, empty native module in C (Continue): Envoy's dynamic module hooks alone", load: loadSpread,
		filter: func(*built) []stack.M {
			return []stack.M{stack.NativeFilter(cFloorModuleName, "floor", []byte("{}"), "")}
		}},
	"2nr": {id: "2nr", name: "Envoy, empty native Go module making a precheck rejection's calls (floor of a native 429)",
		load: loadBlocked, filter: func(*built) []stack.M { return []stack.M{floorModule(`{"reply":true}`)} }},
	"2n": {id: "2n", name: "Envoy, empty native Go module making sluice's callout over the dynamic module HTTP callout, sluice-controlplane, Redis (native callout floor)",
		load: loadSpread, rls: rlsSluice,
		filter: func(*built) []stack.M { return []stack.M{floorModule(`{"callout":"http"}`)} }},
	"2nrd": {id: "2nrd", name: "2n, reading the answer (:status, grpc-status, body)",
		load: loadSpread, rls: rlsSluice,
		filter: func(*built) []stack.M { return []stack.M{floorModule(`{"callout":"http","read":true}`)} }},
	"3": {id: "3", name: "Envoy, its own local_ratelimit (C++), admits all", load: loadSpread,
		filter: func(*built) []stack.M { return []stack.M{localRateLimit()} }},
	"4": {id: "4", name: "Envoy, sluice filter, every request decided by the precheck", load: loadBlocked,
		filter: sluiceFilter, rls: rlsSluiceMemory},
	"5": {id: "5", name: "Envoy ratelimit filter, envoyproxy/ratelimit, Redis", routeLimits: true, rls: rlsPeer,
		filter: rateLimitFilter},
	"6": {id: "6", name: "Envoy ratelimit filter, sluice-controlplane, Redis", routeLimits: true, rls: rlsSluice,
		filter: rateLimitFilter},
	"6h": {id: "6h", name: "Envoy ratelimit filter adding its X-RateLimit headers (DRAFT_VERSION_03), sluice-controlplane, Redis",
		routeLimits: true, rls: rlsSluice, filter: rateLimitFilterHeaders, adds: "x-ratelimit-limit"},
	"6f": {id: "6f", name: "Envoy ratelimit filter, sluice's decision port answering without deciding (transport floor)",
		routeLimits: true, rls: rlsFloor, filter: rateLimitFilter},
	"7": {id: "7", name: "Envoy, sluice filter, sluice-controlplane, Redis", rls: rlsSluice,
		filter: sluiceFilter, adds: "ratelimit"},
	"7b": {id: "7b", name: "setup 7 with the filter.wasm of -base-wasm (another revision's build): an A/B of two builds in one run",
		rls: rlsSluice, adds: "ratelimit", filter: func(b *built) []stack.M { return sluiceFilterAt(b.baseWasm, "") }},
	"7g": {id: "7g", name: "Envoy, sluice filter calling over proxy_grpc_call (transport grpc), sluice-controlplane, Redis",
		rls: rlsSluice, filter: sluiceFilterGRPC},
	"7L": {id: "7L", name: "Envoy, sluice filter, sluice-controlplane, Redis, lease: auto", rls: rlsSluiceLease,
		filter: sluiceFilter},
	"7n": {id: "7n", name: "Envoy, sluice native filter (libsluice.so), sluice-controlplane, Redis", rls: rlsSluice,
		filter: sluiceNative, adds: "ratelimit"},
	"4n": {id: "4n", name: "Envoy, sluice native filter, every request decided by the precheck", load: loadBlocked,
		filter: sluiceNative, rls: rlsSluiceMemory},
	"7Ln": {id: "7Ln", name: "Envoy, sluice native filter, sluice-controlplane, Redis, lease: auto", rls: rlsSluiceLease,
		filter: sluiceNative},
	"7nb": {id: "7nb", name: "setup 7n with the libsluice.so of -base-native (another revision's build): an A/B of two builds in one run",
		rls: rlsSluice, filter: sluiceNativeBase, adds: "ratelimit"},
	"7Lnb": {id: "7Lnb", name: "setup 7Ln with the libsluice.so of -base-native", rls: rlsSluiceLease, filter: sluiceNativeBase},
	"u": {id: "u", name: "Envoy, sluice filter, usage from a response header, settlements batched (default settle)",
		rls: rlsSluice, usage: true, load: loadSpread, filter: func(b *built) []stack.M { return usageFilter(b, nil) }},
	"u1": {id: "u1", name: "Envoy, sluice filter, usage from a response header, one settle call per request",
		rls: rlsSluice, usage: true, load: loadSpread, filter: func(b *built) []stack.M {
			return usageFilter(b, map[string]any{"batch_max": 1, "interval_ms": 0})
		}},
}

// The rate limit service's cluster, domain and descriptor key in every setup.
const (
	rlsCluster = "rls"
	domain     = "bench"
	userHeader = "x-user"
)

// policy is the same limits for both services, in envoyproxy/ratelimit's
// format (sluice reads it as-is; the default algorithm of both is the
// clock-aligned fixed window).
const policy = `domain: bench
descriptors:
  - key: user
    value: hot
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    value: blocked
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100000}
`

func wasmFilter(path string, plugin []byte) stack.M { return stack.WasmFilter(path, plugin) }

// floorModuleName is the native floor's module, lib<name>.so in Envoy's
// working directory (build puts it there).
const floorModuleName = "sluicefloor"

// cFloorModuleName is the native floor in C (cfloor/floor.c).
const cFloorModuleName = "sluicecfloor"

// floorModule is the native floor (filter/native/internal/emptymodule) with
// the configuration conf.
func floorModule(conf string) stack.M {
	return stack.NativeFilter(floorModuleName, "floor", []byte(conf), "")
}

// sluiceFilter is filter.wasm with one descriptor, user = x-user, and the
// precheck on. The call timeout is 100 ms: long enough that this busy
// machine measures decisions rather than the failure mode, short enough for
// the precheck, whose blocks end one timeout before the global limiter's
// retry-after (so that it never rejects what the global limiter admits), to
// hold a per-second window's denials.
func sluiceFilter(b *built) []stack.M { return sluiceFilterWith(b, "") }

// sluiceFilterWith is sluiceFilter with a transport ("": the default).
func sluiceFilterWith(b *built, transport string) []stack.M {
	return sluiceFilterAt(b.filterWasm, transport)
}

// sluiceFilterAt is sluiceFilterWith running the module at wasm.
func sluiceFilterAt(wasm, transport string) []stack.M {
	return []stack.M{wasmFilter(wasm, sluicePlugin(transport))}
}

// sluiceNative is sluiceFilter's configuration on the native filter,
// libsluice.so in Envoy's working directory (build puts it there), with
// filter.wasm's stat names.
func sluiceNative(*built) []stack.M {
	return []stack.M{stack.NativeFilter("sluice", "sluice", sluicePlugin(""), "wasmcustom")}
}

// baseNativeName is -base-native's module, lib<name>.so in Envoy's working
// directory (build copies it there).
const baseNativeName = "sluicebase"

// sluiceNativeBase is sluiceNative with -base-native's build.
func sluiceNativeBase(*built) []stack.M {
	return []stack.M{stack.NativeFilter(baseNativeName, "sluice", sluicePlugin(""), "wasmcustom")}
}

// sluicePlugin is the plugin configuration of sluiceFilter, with a
// transport ("": the default).
func sluicePlugin(transport string) []byte {
	cfg := map[string]any{
		"cluster": rlsCluster, "domain": domain, "timeout": "100ms", "failure_mode": "open",
		"rate_limits": []any{map[string]any{"actions": []any{map[string]any{
			"request_headers": map[string]any{"header_name": userHeader, "descriptor_key": "user"}}}}},
		"precheck": map[string]any{"enabled": true, "max_entries": 20000},
		"headers":  map[string]any{"draft10": true, "legacy": false, "retry_after": true},
	}
	if transport != "" {
		cfg["transport"] = transport
	}
	plugin, _ := json.Marshal(cfg)
	return plugin
}

// sluiceFilterGRPC is sluiceFilter with transport "grpc".
func sluiceFilterGRPC(b *built) []stack.M {
	return sluiceFilterWith(b, "grpc")
}

// Usage setups: the backend reports usageTokens in usageHeader on every
// answer; the filter reserves 1 at request time and settles the rest.
const (
	usageHeader = "x-usage-tokens"
	usageTokens = 10
)

// usageFilter is sluiceFilter with its rate limit usage-based:
// reserve 1, the actual cost from the response header usageHeader, and the
// plugin's settle configuration settle (nil: the defaults, batched).
func usageFilter(b *built, settle map[string]any) []stack.M {
	plugin := map[string]any{
		"cluster": rlsCluster, "domain": domain, "timeout": "100ms", "failure_mode": "open",
		"rate_limits": []any{map[string]any{
			"actions": []any{map[string]any{
				"request_headers": map[string]any{"header_name": userHeader, "descriptor_key": "user"}}},
			"usage": map[string]any{"reserve": 1, "source": map[string]any{"response_header": usageHeader}},
		}},
		"precheck": map[string]any{"enabled": true, "max_entries": 20000},
		"headers":  map[string]any{"draft10": true, "legacy": false, "retry_after": true},
	}
	if settle != nil {
		plugin["settle"] = settle
	}
	js, _ := json.Marshal(plugin)
	return []stack.M{wasmFilter(b.filterWasm, js)}
}

func rateLimitFilter(*built) []stack.M {
	return []stack.M{stack.RateLimitFilter(domain, rlsCluster, stack.M{"failure_mode_deny": false, "timeout": "0.1s"})}
}

// rateLimitFilterHeaders is rateLimitFilter adding rate limit headers to every
// response (X-RateLimit-Limit, -Remaining, -Reset, from the answer's
// current_limit, limit_remaining and duration_until_reset), as setup 7's
// filter adds RateLimit and RateLimit-Policy: setup 6h is the like-for-like
// peer of 7.
func rateLimitFilterHeaders(*built) []stack.M {
	return []stack.M{stack.RateLimitFilter(domain, rlsCluster, stack.M{"failure_mode_deny": false, "timeout": "0.1s",
		"enable_x_ratelimit_headers": "DRAFT_VERSION_03"})}
}

// localRateLimit is Envoy's local_ratelimit with a bucket no load here
// empties: it decides every request and admits it.
func localRateLimit() stack.M {
	return stack.M{
		"name": "envoy.filters.http.local_ratelimit",
		"typed_config": stack.M{
			"@type":       "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
			"stat_prefix": "local_rl",
			"token_bucket": stack.M{"max_tokens": 100000000, "tokens_per_fill": 100000000,
				"fill_interval": "1s"},
			"filter_enabled":  stack.M{"default_value": stack.M{"numerator": 100, "denominator": "HUNDRED"}},
			"filter_enforced": stack.M{"default_value": stack.M{"numerator": 100, "denominator": "HUNDRED"}},
		},
	}
}

// bootstrap is one Envoy: listener "ingress" runs the setup's filters and
// routes to cluster "upstream", which is listener "backend" of the same
// Envoy answering 200 by direct_response.
func (s setup) bootstrap(b *built, backendPort int, rlsAddr string) stack.M {
	route := stack.RouteTo("/", "upstream")
	if s.direct {
		route = stack.DirectResponse("/", 429, "rate limited\n")
	}
	if s.routeLimits {
		route["route"].(stack.M)["rate_limits"] = []stack.M{{"actions": []stack.M{{
			"request_headers": stack.M{"header_name": userHeader, "descriptor_key": "user"}}}}}
	}
	var filters []stack.M
	if s.filter != nil {
		filters = s.filter(b)
	}
	backend := stack.VirtualHost("backend", stack.DirectResponse("/", 200, "ok\n"))
	if s.body > 0 {
		backend = stack.VirtualHost("backend", stack.DirectResponse("/", 200, llmAnswerJSON))
		backend["response_headers_to_add"] = []stack.M{{"header": stack.M{"key": "content-type", "value": "application/json"}}}
	}
	if s.usage {
		backend["response_headers_to_add"] = []stack.M{{"header": stack.M{"key": usageHeader, "value": strconv.Itoa(usageTokens)}}}
	}
	listeners := []stack.M{
		stack.HTTPListener("ingress", 0, []stack.M{stack.VirtualHost("ingress", route)}, filters...),
		stack.HTTPListener("backend", backendPort, []stack.M{backend}),
	}
	upstream := "127.0.0.1:" + strconv.Itoa(backendPort)
	if s.sse {
		upstream = b.sseBackend
	}
	clusters := []stack.M{stack.Cluster("upstream", upstream)}
	if rlsAddr != "" {
		clusters = append(clusters, stack.GRPCCluster(rlsCluster, rlsAddr))
	}
	return stack.Bootstrap(listeners, clusters)
}

// service is a running rate limit service.
type service struct {
	pid     int
	addr    string
	metrics string // sluice-controlplane's metrics URL ("": another service)
	stop    func()
}

// startService starts the setup's rate limit service on a fresh port, after
// emptying Redis, on the policy doc ("" for the setups' policy; setup 7L's
// lease policy always).
func (b *built) startService(ctx context.Context, dir string, kind rls, doc string) (*service, error) {
	if kind == rlsNone {
		return &service{stop: func() {}}, nil
	}
	if err := b.redis.FlushAll(ctx); err != nil {
		return nil, err
	}
	grpc, err := stack.FreePort()
	if err != nil {
		return nil, err
	}
	http, err := stack.FreePort()
	if err != nil {
		return nil, err
	}
	other, err := stack.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(grpc)
	var cmd *exec.Cmd
	metrics := ""
	switch kind {
	case rlsPeer:
		rt := filepath.Join(dir, "runtime", "ratelimit", "config")
		if err := os.MkdirAll(rt, 0o755); err != nil {
			return nil, err
		}
		if doc == "" {
			doc = policy
		}
		if err := os.WriteFile(filepath.Join(rt, "bench.yaml"), []byte(doc), 0o644); err != nil {
			return nil, err
		}
		cmd = exec.Command(b.peer)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(),
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + b.redis.Addr(),
			"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"USE_STATSD=false", "LOG_LEVEL=warn", "HOST=127.0.0.1", "PORT=" + strconv.Itoa(http),
			"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(other),
			"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(grpc)}
	case rlsFloor:
		cmd = exec.Command(b.floor, "-addr", addr)
	case rlsSluice, rlsSluiceMemory, rlsSluiceLease:
		pf := filepath.Join(dir, "bench.yaml")
		if doc == "" {
			doc = policy
		}
		if kind == rlsSluiceLease {
			doc = strings.Replace(policy, "domain: bench\n", "domain: bench\nlease: auto\n", 1)
		}
		if err := os.WriteFile(pf, []byte(doc), 0o644); err != nil {
			return nil, err
		}
		args := []string{"-grpc-addr", addr, "-http-addr", "127.0.0.1:" + strconv.Itoa(http),
			"-policy-addr", "127.0.0.1:" + strconv.Itoa(other), "-policy", pf, "-log-level", "warn"}
		if kind != rlsSluiceMemory {
			// The settlement token budget is for clients that flood; a
			// benchmark's one Envoy settles more than its share of the
			// default within the dedupe TTL, and would measure refusals.
			args = append(args, "-redis-addrs", b.redis.Addr(), "-settle-max-tokens", "1000000000")
		}
		cmd = exec.Command(b.controlPlane, args...)
		metrics = "http://127.0.0.1:" + strconv.Itoa(http) + "/metrics"
	}
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("service-%d.log", grpc)))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	s := &service{pid: cmd.Process.Pid, addr: addr, metrics: metrics, stop: func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}}
	// Ready when the gRPC port accepts connections (Envoy's requests then
	// wait for the warm-up to pass).
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-done:
			return nil, fmt.Errorf("rate limit service exited at start-up; see %s", logf.Name())
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("rate limit service not listening on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// command runs a program in dir with extra environment, failing with its
// output.
func command(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// output runs a program and returns its standard output.
func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return string(out), err
}
