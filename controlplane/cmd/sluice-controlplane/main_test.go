package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestParseFlags(t *testing.T) {
	env := map[string]string{
		"SLUICE_GRPC_ADDR":   "127.0.0.1:1111",
		"SLUICE_HTTP_ADDR":   "127.0.0.1:2222",
		"SLUICE_DEADLINE":    "35ms",
		"SLUICE_REDIS_ADDRS": "a:1, b:2",
		"SLUICE_POLICY":      "/etc/x.yaml,/etc/y",
	}
	c, err := parseFlags([]string{"-http-addr", "127.0.0.1:3333", "-policy", "/p1"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Flags win over the environment, which wins over defaults.
	if c.grpcAddr != "127.0.0.1:1111" || c.httpAddr != "127.0.0.1:3333" || c.deadline != 35*time.Millisecond ||
		strings.Join(c.redisAddrs, "|") != "a:1|b:2" || strings.Join(c.policies, "|") != "/p1" ||
		c.maxDescriptors != 256 || c.logFormat != "auto" || c.gcPercent != DefaultGCPercent || c.gcPercentSet {
		t.Fatalf("parsed %+v", c)
	}
	if c, err := parseFlags(nil, func(k string) string { return map[string]string{"SLUICE_RLQS_ADDR": "127.0.0.1:4444"}[k] }, io.Discard); err != nil ||
		c.rlqsAddr != "127.0.0.1:4444" || c.rlqsTTL != 15*time.Second || c.rlqsMaxBuckets != 1024 {
		t.Fatalf("$SLUICE_RLQS_ADDR: %+v, %v", c, err)
	}
	if c, err := parseFlags([]string{"-quota-mode"}, func(k string) string {
		return map[string]string{"SLUICE_CHARGE_PAST_LIMIT": "true", "SLUICE_RESPONSE_DYNAMIC_METADATA": "1"}[k]
	}, io.Discard); err != nil || !c.chargePastLimit || !c.quotaMode || !c.responseMetadata {
		t.Fatalf("envoyproxy/ratelimit switches: %+v, %v", c, err)
	}
	if c, err := parseFlags(nil, func(string) string { return "" }, io.Discard); err != nil || c.chargePastLimit || c.quotaMode || c.responseMetadata {
		t.Fatalf("envoyproxy/ratelimit switches default on: %+v, %v", c, err)
	}
	bounds := map[string]string{"SLUICE_MAX_CONNS": "10", "SLUICE_MAX_STREAMS_PER_CONN": "20", "SLUICE_MAX_CONN_BUFFER_BYTES": "30",
		"SLUICE_MAX_BUFFER_BYTES": "40", "SLUICE_IDLE_TIMEOUT": "50s", "SLUICE_FIRST_CALL_TIMEOUT": "3s", "SLUICE_REQUEST_BODY_TIMEOUT": "600ms"}
	if c, err := parseFlags([]string{"-max-conns", "11"}, func(k string) string { return bounds[k] }, io.Discard); err != nil ||
		c.maxConns != 11 || c.maxStreamsPerConn != 20 || c.maxConnBufferBytes != 30 || c.maxBufferBytes != 40 || c.idleTimeout != 50*time.Second ||
		c.firstCallTimeout != 3*time.Second || c.requestBodyTimeout != 600*time.Millisecond {
		t.Fatalf("bounds: %+v, %v", c, err)
	}
	if c, err := parseFlags(nil, func(string) string { return "" }, io.Discard); err != nil || c.settleTTL != 15*time.Minute {
		t.Fatalf("-settle-dedupe-ttl default: %+v, %v", c, err)
	}
	if c, err := parseFlags(nil, func(k string) string { return map[string]string{"SLUICE_SETTLE_DEDUPE_TTL": "1h"}[k] }, io.Discard); err != nil ||
		c.settleTTL != time.Hour {
		t.Fatalf("$SLUICE_SETTLE_DEDUPE_TTL: %+v, %v", c, err)
	}
	if c, err := parseFlags(nil, func(k string) string { return map[string]string{"SLUICE_GC_PERCENT": "150"}[k] }, io.Discard); err != nil ||
		c.gcPercent != 150 || !c.gcPercentSet {
		t.Fatalf("$SLUICE_GC_PERCENT: %+v, %v", c, err)
	}
	u, err := parseFlags([]string{"-max-conns", "9", "-idle-timeout", "1m"}, func(k string) string {
		return map[string]string{"SLUICE_MAX_STREAMS_PER_CONN": "7", "SLUICE_MAX_BUFFER_BYTES": "1000000", "SLUICE_MAX_CONNS": "3"}[k]
	}, io.Discard)
	// (server's TestUnaryOptions: these reach the unary server.)
	if err != nil || u.maxConns != 9 || u.maxStreamsPerConn != 7 || u.maxBufferBytes != 1000000 ||
		u.idleTimeout != time.Minute || u.maxMsgBytes != 64<<10 || u.maxConnBufferBytes != 4<<20 { // connbounds.Default.MaxConnBufferBytes
		t.Fatalf("unary server flags: %+v, %v", u, err)
	}
	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-deadline", "0s"}, nil, "-deadline must be positive"},
		{[]string{"-nope"}, nil, "unknown flag -nope"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"SLUICE_PROBE_INTERVAL": "soon"}, `$SLUICE_PROBE_INTERVAL="soon": invalid value for -probe-interval`},
		{[]string{"-max-descriptors", "-1"}, nil, "-max-descriptors must be positive"},
		{[]string{"-gc-percent", "0"}, nil, "-gc-percent must be positive"},
		{[]string{"-rlqs-ttl", "1500ms"}, nil, "-rlqs-ttl must be whole seconds"},
		{[]string{"-rlqs-ttl", "1s"}, nil, "-rlqs-ttl must be whole seconds, at least 2s"},
		{nil, map[string]string{"SLUICE_RLQS_MAX_BUCKETS": "0"}, "-rlqs-max-buckets positive"},
		{[]string{"-rlqs-max-bucket-bytes", "0"}, nil, "-rlqs-max-bucket-bytes must be positive"},
		{[]string{"-max-conns", "0"}, nil, "-max-conns, -max-streams-per-conn"},
		{nil, map[string]string{"SLUICE_IDLE_TIMEOUT": "-1s"}, "-idle-timeout must be positive"},
		{[]string{"-request-body-timeout", "0s"}, nil, "-first-call-timeout and -request-body-timeout must be positive"},
		{[]string{"-max-streams-per-conn", "4294967296"}, nil, "-max-streams-per-conn must be at most"},
		{[]string{"-settle-dedupe-ttl", "500us"}, nil, "-settle-dedupe-ttl must be at least 1ms"},
	}
	for _, b := range bad {
		_, err := parseFlags(b.args, func(k string) string { return b.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%v %v: %v, want %q", b.args, b.env, err, b.want)
		}
	}
	for _, c := range []*config{{logLevel: "loud", logFormat: "json"}, {logLevel: "info", logFormat: "xml"}} {
		if _, err := newLogger(c, io.Discard); err == nil {
			t.Errorf("newLogger accepted %+v", c)
		}
	}
}

// buildDir holds the binary the tests build; TestMain removes it.
var buildDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-controlplane-test")
	if err != nil {
		panic(err)
	}
	buildDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds the command once per test binary run.
var binary = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(buildDir, "sluice-controlplane")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", &buildError{err, string(out)}
	}
	return bin, nil
})

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// proc is a running control plane.
type proc struct {
	cmd      *exec.Cmd
	mu       sync.Mutex
	logs     bytes.Buffer
	serving  chan map[string]any // the "serving" log record
	exited   chan struct{}
	exitCode int
}

// startBinary runs the binary with args and env on free ports and waits for
// its "serving" log line.
func startBinary(t *testing.T, env []string, args ...string) (*proc, map[string]any) {
	t.Helper()
	return startBinaryIn(t, "", env, args...)
}

// startBinaryIn is startBinary in the working directory dir ("": the
// test's).
func startBinaryIn(t *testing.T, dir string, env []string, args ...string) (*proc, map[string]any) {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	args = append([]string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-policy-addr", "127.0.0.1:0", "-log-format", "json"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	return startCmd(t, cmd, env)
}

// startCmd starts cmd, a control plane, with env added to the test's
// environment and waits for its "serving" log line.
func startCmd(t *testing.T, cmd *exec.Cmd, env []string) (*proc, map[string]any) {
	t.Helper()
	p := &proc{cmd: cmd, serving: make(chan map[string]any, 1), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			p.mu.Lock()
			p.logs.Write(line)
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(line, &rec) == nil && rec["msg"] == "serving" {
				p.serving <- rec
			}
		}
		p.cmd.Wait()
		p.exitCode = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case rec := <-p.serving:
		return p, rec
	case <-p.exited:
		t.Fatalf("exited with %d before serving:\n%s", p.exitCode, p.output())
	case <-time.After(20 * time.Second):
		t.Fatalf("not serving within 20 s:\n%s", p.output())
	}
	return nil, nil
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		return p.exitCode
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after SIGTERM:\n%s", p.output())
	}
	return -1
}

const binPolicy = `
domain: bin
response_headers: true
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
`

func writePolicy(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bin.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// call makes one ShouldRateLimit call of domain bin for user on a new
// connection.
func call(t *testing.T, addr, user string) *rlsv3.RateLimitResponse {
	t.Helper()
	return callDomain(t, addr, "bin", user)
}

// callDomain makes one ShouldRateLimit call of domain for user on a new
// connection.
func callDomain(t *testing.T, addr, domain, user string) *rlsv3.RateLimitResponse {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}},
	})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBinaryMemory runs the built binary with the embedded memory store:
// decisions over real gRPC, /metrics, a policy change through the
// authenticated policy service, and a clean exit on SIGTERM.
func TestBinaryMemory(t *testing.T) {
	path := writePolicy(t, binPolicy)
	const token = "test-token-0123456789abcdef"
	p, rec := startBinary(t, []string{"SLUICE_TOKEN=" + token}, "-policy", path)
	grpcAddr, httpAddr, policyAddr := rec["grpc"].(string), rec["http"].(string), rec["policy"].(string)
	if rec["store"] != "memory" || rec["domains"] != "bin" {
		t.Fatalf("serving record %v", rec)
	}
	var codes []string
	for i := 0; i < 3; i++ {
		codes = append(codes, call(t, grpcAddr, "a").OverallCode.String())
	}
	if strings.Join(codes, " ") != "OK OK OVER_LIMIT" {
		t.Fatalf("codes %v", codes)
	}
	resp := call(t, grpcAddr, "b")
	if len(resp.ResponseHeadersToAdd) != 2 || resp.ResponseHeadersToAdd[0].Value != `"per_user";q=2;w=60` {
		t.Errorf("headers %v", resp.ResponseHeadersToAdd)
	}
	code, metrics := httpGet(t, "http://"+httpAddr+"/metrics")
	if code != 200 || !strings.Contains(metrics, `sluice_rls_decisions_total{code="OVER_LIMIT",domain="bin"} 1`) ||
		!strings.Contains(metrics, `sluice_rls_decisions_total{code="OK",domain="bin"} 3`) {
		t.Errorf("/metrics %d:\n%s", code, metrics)
	}
	if code, _ := httpGet(t, "http://"+httpAddr+"/readyz"); code != 200 {
		t.Errorf("/readyz %d", code)
	}

	// Change the limits through the policy service: refused without the
	// token; with it, refused for the domain the -policy file owns (naming
	// the file, changing nothing), applied for another domain.
	conn, err := grpc.NewClient(policyAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pc := sluicev1.NewPolicyServiceClient(conn)
	raised := strings.Replace(binPolicy, "requests_per_unit: 2", "requests_per_unit: 50", 1)
	req := &sluicev1.ApplyRequest{Source: "raised.yaml", Yaml: raised}
	if _, err := pc.Apply(context.Background(), req); status.Code(err) != grpccodes.Unauthenticated {
		t.Fatalf("Apply without a token: %v, want Unauthenticated", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	if _, err := pc.Apply(ctx, req); status.Code(err) != grpccodes.FailedPrecondition || !strings.Contains(err.Error(), path) {
		t.Fatalf("Apply on the file's domain: %v, want FailedPrecondition naming %s", err, path)
	}
	if got := call(t, grpcAddr, "c").Statuses[0].CurrentLimit.RequestsPerUnit; got != 2 {
		t.Fatalf("limit after a refused Apply = %d, want 2", got)
	}
	other := strings.Replace(raised, "domain: bin", "domain: other", 1)
	if _, err := pc.Apply(ctx, &sluicev1.ApplyRequest{Source: "other.yaml", Yaml: other}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	list, err := pc.List(ctx, &sluicev1.ListRequest{})
	if err != nil || len(list.Policies) != 2 || list.Policies[0].Owner != path || list.Policies[1].Owner != "" {
		t.Fatalf("List: %v, %v; want bin owned by %s and other the store's", list, err, path)
	}

	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	if out := p.output(); !strings.Contains(out, `"msg":"stopped"`) || strings.Contains(out, token) {
		t.Errorf("logs lack the stop or show the token:\n%s", out)
	}
}

// TestBinaryRedis configures Redis through the environment and checks that
// decisions land in it.
func TestBinaryRedis(t *testing.T) {
	rs := redistest.StartServer(t)
	p, rec := startBinary(t, []string{"SLUICE_REDIS_ADDRS=" + rs.Addr(), "SLUICE_POLICY=" + writePolicy(t, binPolicy)})
	if rec["store"] != "redis|memory" {
		t.Fatalf("serving record %v", rec)
	}
	if r := call(t, rec["grpc"].(string), "r"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("call: %v", r)
	}
	c := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer c.Close()
	// One decision key, beside the policy store's keys.
	keys, err := c.Keys(context.Background(), "*").Result()
	var decisionKeys []string
	for _, k := range keys {
		if !strings.HasPrefix(k, "sluice:{policies}:") {
			decisionKeys = append(decisionKeys, k)
		}
	}
	if err != nil || len(decisionKeys) != 1 {
		t.Fatalf("Redis holds decision keys %q (%v)", decisionKeys, err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestBinaryBadConfig: configuration errors exit with status 2 and say why.
func TestBinaryBadConfig(t *testing.T) {
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	badPolicy := writePolicy(t, "domain: bin\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-redis-mode", "etcd"}, `unknown redis mode`},
		{[]string{"-policy", badPolicy}, `bin.yaml:4: domain \"bin\": descriptors[0].rate_limit.unit: unknown unit`},
		// Unlike envoyproxy/ratelimit, which stays up answering Unknown: a
		// rate limiter that starts without its policies admits everything.
		{[]string{"-policy", writePolicy(t, "domain: bin\ndescriptors: &d [{key: k, descriptors: *d}]\n")}, `bin.yaml:2: domain \"bin\": descriptors[0].descriptors: alias *d refers to a node that contains it`},
		{[]string{"-policy", writePolicy(t, "domain: bin\ndescriptors: "+strings.Repeat("[{key: k, descriptors: ", 4990)+"[]"+strings.Repeat("}]", 4990)+"\n")}, `nested too deeply`},
		{[]string{"-log-level", "loud"}, `-log-level "loud"`},
	}
	for _, c := range cases {
		cmd := exec.Command(bin, append([]string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, c.args...)...)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: exit %d (%v), output %s; want 2 and %q", c.args, cmd.ProcessState.ExitCode(), err, out, c.want)
		}
	}
}

// waitLog waits until the process has logged n lines holding s, and returns
// the last of them.
func (p *proc) waitLog(t *testing.T, s string, n int) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var found []string
		for _, l := range strings.Split(p.output(), "\n") {
			if strings.Contains(l, s) {
				found = append(found, l)
			}
		}
		if len(found) >= n {
			return found[n-1]
		}
		select {
		case <-p.exited:
			t.Fatalf("exited with %d waiting for log line %d holding %q:\n%s", p.exitCode, n, s, p.output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %d holding %q within 15 s:\n%s", n, s, p.output())
		}
	}
}

// TestBinarySIGHUP: SIGHUP re-reads the -policy files. A valid set is
// applied (the served limit changes); an invalid one is refused with file,
// line and field, and the served limit stays; the process survives both.
func TestBinarySIGHUP(t *testing.T) {
	path := writePolicy(t, binPolicy)
	p, rec := startBinary(t, nil, "-policy", path)
	grpcAddr := rec["grpc"].(string)
	limit := func() uint32 { return call(t, grpcAddr, "hup").Statuses[0].CurrentLimit.RequestsPerUnit }
	if got := limit(); got != 2 {
		t.Fatalf("limit %d before SIGHUP, want 2", got)
	}
	hup := func() {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	write := func(doc string) {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write(strings.Replace(binPolicy, "requests_per_unit: 2", "requests_per_unit: 7", 1))
	hup()
	line := p.waitLog(t, "SIGHUP: the policy files are in force", 1)
	if !strings.Contains(line, `"changed":"bin"`) {
		t.Errorf("log line %s", line)
	}
	if got := limit(); got != 7 {
		t.Fatalf("limit %d after a good SIGHUP, want 7", got)
	}

	bad := []struct{ doc, want string }{
		{"domain: bin\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`bin.yaml:4: domain \"bin\": descriptors[0].rate_limit.unit: unknown unit \"fortnight\"`},
		{"domain: bin\ndescriptors: &d [{key: k, descriptors: *d}]\n", `bin.yaml:2: domain \"bin\": descriptors[0].descriptors: alias *d refers to a node that contains it`},
	}
	for i, b := range bad {
		write(b.doc)
		hup()
		line := p.waitLog(t, "SIGHUP: refused the -policy files; the policies in force stay", i+1)
		if !strings.Contains(line, b.want) || !strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("log line %s\nwant it to hold %s", line, b.want)
		}
		if got := limit(); got != 7 {
			t.Fatalf("limit %d after a bad SIGHUP, want 7 (kept)", got)
		}
	}
	t.Logf("SIGHUP log lines:\n%s\n%s", p.waitLog(t, "SIGHUP: the policy files are in force", 1), p.waitLog(t, "SIGHUP: refused", 2))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestBinarySIGHUPRedis: with Redis, one replica's SIGHUP changes what every
// replica serves.
func TestBinarySIGHUPRedis(t *testing.T) {
	rs := redistest.StartServer(t)
	path := writePolicy(t, binPolicy)
	env := []string{"SLUICE_REDIS_ADDRS=" + rs.Addr()}
	p1, rec1 := startBinary(t, env, "-policy", path)
	_, rec2 := startBinary(t, env, "-policy", writePolicy(t, binPolicy))
	limit := func(rec map[string]any) uint32 {
		return call(t, rec["grpc"].(string), "hup").Statuses[0].CurrentLimit.RequestsPerUnit
	}
	if a, b := limit(rec1), limit(rec2); a != 2 || b != 2 {
		t.Fatalf("limits %d and %d before SIGHUP, want 2", a, b)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(binPolicy, "requests_per_unit: 2", "requests_per_unit: 9", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p1.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p1.waitLog(t, "SIGHUP: the policy files are in force", 1)
	start := time.Now()
	for limit(rec2) != 9 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the other replica still serves %d 10 s after the SIGHUP, want 9", limit(rec2))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the other replica followed in %v", time.Since(start).Round(time.Millisecond))
}
