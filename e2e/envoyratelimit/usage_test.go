package envoyratelimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// usagePolicy limits the tokens of user per day. It is envoyproxy/ratelimit's
// format as-is: both services read this one file (sluice charges past the
// limit with -charge-past-limit, the switch for files that cannot say
// charge_past_limit, such as Envoy Gateway's).
const usagePolicy = `
domain: llm
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100}
`

// tokensUpstream answers every request with the token count it asks for
// (?tokens=N) in x-llm-tokens, as an LLM backend reports its usage.
func tokensUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-llm-tokens", r.URL.Query().Get("tokens"))
		fmt.Fprintln(w, "completion")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// usageEnvoy runs Envoy's own ratelimit filter the way Envoy Gateway
// configures a response cost (and Envoy AI Gateway its token limits): a
// request-time rate limit whose descriptor has hits_addend 0, and the same
// descriptor again with apply_on_stream_done and hits_addend from dynamic
// metadata, which a Lua filter sets from the upstream's x-llm-tokens.
func usageEnvoy(t *testing.T, dir, rlsAddr, upstream string) *stack.Envoy {
	t.Helper()
	user := []stack.M{{"request_headers": stack.M{"header_name": "x-user", "descriptor_key": "user"}}}
	route := stack.RouteTo("/", "up")
	lua := stack.ResponseCost(route, user, "x-llm-tokens")
	rl := stack.RateLimitFilter("llm", "rls", stack.M{
		"timeout":                            "1s",
		"enable_x_ratelimit_headers":         "DRAFT_VERSION_03",
		"disable_x_envoy_ratelimited_header": true,
	})
	boot := stack.Bootstrap(
		[]stack.M{stack.HTTPListener("llm", 0, []stack.M{stack.VirtualHost("all", route)}, lua, rl)},
		[]stack.M{stack.Cluster("up", upstream), stack.GRPCCluster("rls", rlsAddr)})
	return startEnvoy(t, context.Background(), stack.EnvoyConfig{Dir: dir, Bootstrap: boot})
}

// startPeer runs envoyproxy/ratelimit (bench/ratelimit-peer, built at the
// version Envoy Gateway v1.9.0 pins) on Redis with policy, and returns its
// gRPC address.
func startPeer(t *testing.T, dir, redisAddr, policy string) string {
	t.Helper()
	bin := filepath.Join(dir, "ratelimit-peer")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "bench", "ratelimit-peer")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building envoyproxy/ratelimit (bench/ratelimit-peer): %v\n%s", err, out)
	}
	return startPeerBinary(t, bin, dir, redisAddr, policy)
}

// startPeerBinary runs the envoyproxy/ratelimit binary bin on Redis with
// policy (its domain's file under dir/runtime) and the extra environment,
// and returns its gRPC address once it is healthy.
func startPeerBinary(t *testing.T, bin, dir, redisAddr, policy string, extra ...string) string {
	t.Helper()
	conf := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "policy.yaml"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	var ports [3]int
	for i := range ports {
		p, err := stack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	logf, err := os.Create(filepath.Join(dir, "ratelimit.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[0]), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[1]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[2])}
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("envoyproxy/ratelimit's log:\n%s", lastLines(string(b), 30))
		}
	})
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", ports[0])
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get(health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit not healthy at %s after 30s", health)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[2])
}

// startSluice runs sluice-controlplane on Redis with policy and args, and
// returns its gRPC address.
func startSluice(t *testing.T, dir, redisAddr, policy string, args ...string) string {
	t.Helper()
	pol := filepath.Join(dir, "llm.yaml")
	if err := os.WriteFile(pol, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := stack.StartControlPlane(context.Background(), stack.ControlPlaneConfig{Binary: controlPlane, Dir: dir,
		Policies: []string{pol}, RedisAddr: redisAddr, Args: append([]string{"-deadline", "500ms"}, args...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	return cp.GRPCAddr()
}

// usageStep is one request of the scenario and what it saw.
type usageStep struct {
	tokens    int    // the usage the upstream reports for it
	code      int    // the status Envoy answered
	remaining string // x-ratelimit-remaining on that answer
	settled   string // x-ratelimit-remaining once its usage is charged ("-" if never seen)
}

// runUsage sends the scenario's requests as user through e: each reports
// tokens of usage; after each, once Envoy's calls to the rate limit
// service for it are answered (an admitted request's stream-end charge
// too), probes (requests of 0 tokens) wait until the charge shows in
// x-ratelimit-remaining (want, the value sluice reaches) or 5 s pass, so
// the next request sees it. (A remaining of 0 shows before a charge past
// the limit lands: the probes alone let the next request overtake it.)
func runUsage(t *testing.T, e *stack.Envoy, user string, tokens []int, settle []string) []usageStep {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(n int) (int, string) {
		req, err := http.NewRequest("GET", e.URL("llm")+"/chat?tokens="+strconv.Itoa(n), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-user", user)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("x-ratelimit-remaining")
	}
	var steps []usageStep
	for i, n := range tokens {
		s := usageStep{tokens: n, settled: "-"}
		calls := rlsCalls(t, e)
		s.code, s.remaining = get(n)
		// its calls answered: the request's, and for an admitted request
		// the stream-end charge
		want := calls + 1
		if s.code == http.StatusOK {
			want++
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			st, err := e.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if total := st["cluster.rls.upstream_rq_total"]; total >= want && st["cluster.rls.upstream_rq_completed"] >= total {
				break
			}
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, r := get(0); r == settle[i] {
				s.settled = r
				break
			}
		}
		steps = append(steps, s)
	}
	return steps
}

// rlsCalls returns the calls e made to the rate limit service.
func rlsCalls(t *testing.T, e *stack.Envoy) int64 {
	t.Helper()
	st, err := e.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st["cluster.rls.upstream_rq_total"]
}

// TestResponseCostEnvoy runs Envoy Gateway's response-cost configuration
// through real Envoy against sluice and against envoyproxy/ratelimit (Redis
// for each, one policy file): 100 tokens a day, two users.
//
//   - "exact": requests that use 40, 40, 20, 30, 10 tokens.
//     x-ratelimit-remaining falls 100, 60, 20 as the stream-end calls charge
//     the tokens, on both. At exactly 0 remaining sluice refuses;
//     envoyproxy/ratelimit refuses only past the limit, so it admits one
//     more request, whose usage is overshoot too.
//   - "past": 40, 40, 30, 10. The third request starts with 20 remaining
//     and uses 30: sluice charges it past the limit (with charge_past_limit
//     or -charge-past-limit) and refuses the fourth, as envoyproxy/ratelimit
//     does. Without either, sluice refuses the charge (a cost above what
//     remains takes nothing), so the fourth passes: the case the policy
//     field is for.
func TestResponseCostEnvoy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, redis-server, sluice and envoyproxy/ratelimit")
	}
	if untilNext(time.Now(), 24*time.Hour) < time.Minute {
		t.Skip("within a minute of UTC midnight: the day window would reset mid-test")
	}
	type want struct {
		code      int
		remaining string // on the answer
		settled   string // once the request's tokens are charged
	}
	seqs := []struct {
		name   string
		tokens []int
	}{{"exact", []int{40, 40, 20, 30, 10}}, {"past", []int{40, 40, 30, 10}}}
	charging := map[string][]want{
		"exact": {{200, "100", "60"}, {200, "60", "20"}, {200, "20", "0"}, {429, "0", "0"}, {429, "0", "0"}},
		"past":  {{200, "100", "60"}, {200, "60", "20"}, {200, "20", "0"}, {429, "0", "0"}},
	}
	withField := strings.Replace(usagePolicy, "  - key: user\n", "  - key: user\n    charge_past_limit: true\n", 1)
	cases := []struct {
		name  string
		start func(t *testing.T, dir, redisAddr string) string
		want  map[string][]want
	}{
		{"sluice -charge-past-limit", func(t *testing.T, dir, redisAddr string) string {
			return startSluice(t, dir, redisAddr, usagePolicy, "-charge-past-limit")
		}, charging},
		{"sluice charge_past_limit", func(t *testing.T, dir, redisAddr string) string {
			return startSluice(t, dir, redisAddr, withField)
		}, charging},
		{"sluice neither", func(t *testing.T, dir, redisAddr string) string {
			return startSluice(t, dir, redisAddr, usagePolicy)
		}, map[string][]want{
			"exact": charging["exact"],
			"past":  {{200, "100", "60"}, {200, "60", "20"}, {200, "20", "20"}, {200, "20", "10"}},
		}},
		{"envoyproxy/ratelimit", func(t *testing.T, dir, redisAddr string) string {
			return startPeer(t, dir, redisAddr, usagePolicy)
		}, map[string][]want{
			"exact": {{200, "100", "60"}, {200, "60", "20"}, {200, "20", "0"}, {200, "0", "0"}, {429, "0", "0"}},
			"past":  charging["past"],
		}},
	}
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	results := map[string][]usageStep{} // by case and sequence
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			rls := c.start(t, dir, redistest.StartServer(t).Addr())
			e := usageEnvoy(t, dir, rls, tokensUpstream(t))
			for _, seq := range seqs {
				w := c.want[seq.name]
				settle := make([]string, len(w))
				for i := range w {
					settle[i] = w[i].settled
				}
				steps := runUsage(t, e, seq.name+run, seq.tokens, settle)
				results[c.name+"/"+seq.name] = steps
				for i, s := range steps {
					if s.code != w[i].code || s.remaining != w[i].remaining || s.settled != w[i].settled {
						t.Errorf("%s, request %d (%d tokens): %d, x-ratelimit-remaining %q, then %q; want %d %q, then %q",
							seq.name, i+1, s.tokens, s.code, s.remaining, s.settled, w[i].code, w[i].remaining, w[i].settled)
					}
				}
			}
		})
	}
	var b strings.Builder
	for _, seq := range seqs {
		fmt.Fprintf(&b, "%s:\n%-8s %-6s", seq.name, "request", "tokens")
		for _, c := range cases {
			fmt.Fprintf(&b, " %-26s", c.name)
		}
		b.WriteString("\n")
		for i, n := range seq.tokens {
			fmt.Fprintf(&b, "%-8d %-6d", i+1, n)
			for _, c := range cases {
				cell := "-"
				if r := results[c.name+"/"+seq.name]; i < len(r) {
					cell = fmt.Sprintf("%d rem=%s -> %s", r[i].code, r[i].remaining, r[i].settled)
				}
				fmt.Fprintf(&b, " %-26s", cell)
			}
			b.WriteString("\n")
		}
	}
	t.Logf("status, x-ratelimit-remaining, and the remaining once its tokens are charged:\n%s", b.String())
}
