package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/portlock"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The reproductions of "policy files lose to whatever Redis already holds",
// with real processes on a real redis-server: the -policy files own their
// domains, at every start and through a rolling update.

// convergeWithin bounds how long a replica may take to serve a change made
// through another (about a second: notification, else the 1 s poll).
const convergeWithin = 10 * time.Second

// limitPolicy is domain's policy: n requests an hour per user.
func limitPolicy(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", domain, n)
}

// probes makes each limitOf call a new user, so that no probe is refused
// for the probes before it.
var probes atomic.Int64

// limitOf asks the control plane at addr about a new user of domain and
// returns the limit that applies, 0 when none does (an unknown domain).
func limitOf(t *testing.T, addr, domain string) uint32 {
	t.Helper()
	resp := callDomain(t, addr, domain, "probe-"+strconv.FormatInt(probes.Add(1), 10))
	if len(resp.Statuses) == 0 || resp.Statuses[0].CurrentLimit == nil {
		return 0
	}
	return resp.Statuses[0].CurrentLimit.RequestsPerUnit
}

// waitLimits waits until every replica serves the limits want (domain ->
// requests an hour, 0: no limit) and returns how long that took.
func waitLimits(t *testing.T, what string, want map[string]uint32, replicas ...*replica) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var wrong []string
		for _, r := range replicas {
			for d, w := range want {
				if got := limitOf(t, r.grpc, d); got != w {
					wrong = append(wrong, fmt.Sprintf("%s serves %s at %d", r.name, d, got))
				}
			}
		}
		if len(wrong) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > convergeWithin {
			t.Fatalf("%s: not within %v: %s (want %v)", what, convergeWithin, strings.Join(wrong, ", "), want)
		}
		time.Sleep(50 * time.Millisecond) // a real process converging over Redis
	}
}

// replica is a running control plane.
type replica struct {
	name string
	*proc
	grpc string
}

// writePolicies writes one file per domain (limits: domain -> requests an
// hour) into dir, replacing what it held, and returns dir.
func writePolicies(t *testing.T, dir string, limits map[string]int) string {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for d, n := range limits {
		if err := os.WriteFile(filepath.Join(dir, d+".yaml"), []byte(limitPolicy(d, n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestOwnershipRestartWithChangedFile: `-redis-addrs R -policy a.yaml`,
// stopped, a.yaml changed from 10 to 3 an hour, started again: the file's 3
// is in force (it used to stay 10: the start-up policies seeded an empty
// store only). With -policy-seed-only the store's version stays, as before.
func TestOwnershipRestartWithChangedFile(t *testing.T) {
	rs := redistest.StartServer(t)
	env := []string{"SLUICE_REDIS_ADDRS=" + rs.Addr()}
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	write := func(n int) {
		if err := os.WriteFile(file, []byte(limitPolicy("dx", n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(10)
	p, rec := startBinary(t, env, "-policy", file)
	if got := limitOf(t, rec["grpc"].(string), "dx"); got != 10 {
		t.Fatalf("first start: limit %d, want 10", got)
	}
	p.stop(t)
	write(3)
	p, rec = startBinary(t, env, "-policy", file)
	if got := limitOf(t, rec["grpc"].(string), "dx"); got != 3 {
		t.Fatalf("restart with the file changed to 3: limit %d, want 3\n%s", got, p.output())
	}
	line := p.waitLog(t, "start-up: the policy files are in force", 1)
	if !strings.Contains(line, `"changed":"dx"`) {
		t.Errorf("start-up log line: %s", line)
	}
	t.Logf("%s", line)
	p.stop(t)

	// The old behaviour, by its flag: the store's version stays.
	write(7)
	p, rec = startBinary(t, env, "-policy", file, "-policy-seed-only")
	if got := limitOf(t, rec["grpc"].(string), "dx"); got != 3 {
		t.Fatalf("-policy-seed-only restart with the file changed to 7: limit %d, want 3 (the store's)", got)
	}
	p.stop(t)
}

// TestOwnershipRatelimitEnvRestart: the same as /bin/ratelimit with
// envoyproxy/ratelimit's environment (CONFIG_TYPE=FILE, RUNTIME_ROOT,
// REDIS_URL): the changed file is in force after the restart, as
// envoyproxy/ratelimit reads its files at every start.
func TestOwnershipRatelimitEnvRestart(t *testing.T) {
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	rl := filepath.Join(t.TempDir(), RatelimitName)
	if err := os.Symlink(bin, rl); err != nil {
		t.Fatal(err)
	}
	rs := redistest.StartServer(t)
	root := t.TempDir()
	conf := filepath.Join(root, "ratelimit", "config")
	var ports []string
	for range 4 {
		port, err := portlock.Reserve()
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, strconv.Itoa(port))
	}
	env := []string{"CONFIG_TYPE=FILE", "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + rs.Addr(), "LOG_FORMAT=json", "LOG_LEVEL=info", "HOST=127.0.0.1", "PORT=" + ports[0], "GRPC_HOST=127.0.0.1",
		"GRPC_PORT=" + ports[1], "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[2], "USE_PROMETHEUS=false", "SLUICE_POLICY_ADDR=127.0.0.1:" + ports[3]}
	grpcAddr := "127.0.0.1:" + ports[1]
	for i, n := range []int{10, 3} {
		writePolicies(t, conf, map[string]int{"dx": n})
		p, _ := startCmd(t, exec.Command(rl), env)
		if got := limitOf(t, grpcAddr, "dx"); got != uint32(n) {
			t.Fatalf("start %d with the runtime file at %d: limit %d\n%s", i+1, n, got, p.output())
		}
		_, body := httpGet(t, "http://127.0.0.1:"+ports[2]+"/rlconfig")
		if want := `# domain "dx", owner ` + filepath.Join(conf, "dx.yaml"); !strings.Contains(body, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, body)
		}
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit %d:\n%s", code, p.output())
		}
	}
}

// TestOwnershipSecondControlPlane: a second control plane started with a
// file for another domain, on a Redis that holds other domains (one a
// file's, one ratectl's), serves its domain, and so does the first; the
// other domains stay.
func TestOwnershipSecondControlPlane(t *testing.T) {
	rs := redistest.StartServer(t)
	env := []string{"SLUICE_REDIS_ADDRS=" + rs.Addr(), "SLUICE_TOKEN=" + shareToken}
	first := writePolicies(t, filepath.Join(t.TempDir(), "first"), map[string]int{"da": 4})
	p1, rec1 := startBinary(t, env, "-policy", first)
	a := &replica{"first", p1, rec1["grpc"].(string)}
	applyDomain(t, rec1["policy"].(string), limitPolicy("ds", 6))
	second := writePolicies(t, filepath.Join(t.TempDir(), "second"), map[string]int{"db": 5})
	p2, rec2 := startBinary(t, env, "-policy", second)
	b := &replica{"second", p2, rec2["grpc"].(string)}
	waitLimits(t, "both control planes", map[string]uint32{"da": 4, "db": 5, "ds": 6}, a, b)
}

// applyDomain applies doc through the policy service at addr, as ratectl
// apply does.
func applyDomain(t *testing.T, addr, doc string) {
	t.Helper()
	if err := policyCall(addr, func(ctx context.Context, c sluicev1.PolicyServiceClient) error {
		_, err := c.Apply(ctx, &sluicev1.ApplyRequest{Source: "ratectl.yaml", Yaml: doc})
		return err
	}); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

// TestOwnershipRollingUpdate runs the Helm chart's deployment
// (-policy=policies -policy-watch, every replica on one Redis) through a
// rolling update with three replicas, each in a directory of its own as a
// pod has its ConfigMap volume: the newest files win, an old replica that
// restarts mid-rollout changes nothing, a domain dropped from the files
// goes, a file changed in place (a ConfigMap update) is put in force by the
// watch, a refused file leaves what is in force, and a rollback (new pods
// with the old files) puts the old files back.
func TestOwnershipRollingUpdate(t *testing.T) {
	rs := redistest.StartServer(t)
	env := []string{"SLUICE_REDIS_ADDRS=" + rs.Addr()}
	root := t.TempDir()
	v1 := map[string]int{"dx": 10, "dy": 5}
	v2 := map[string]int{"dx": 3} // dy removed
	pod := func(name string, limits map[string]int) *replica {
		dir := filepath.Join(root, name)
		writePolicies(t, filepath.Join(dir, "policies"), limits)
		return startPod(t, dir, name, env)
	}
	restart := func(r *replica) *replica {
		r.stop(t)
		return startPod(t, r.cmd.Dir, r.name, env)
	}
	a, b, c := pod("a", v1), pod("b", v1), pod("c", v1)
	waitLimits(t, "v1 on three replicas", map[string]uint32{"dx": 10, "dy": 5}, a, b, c)

	d := pod("d", v2)
	took := waitLimits(t, "v2 from the first new replica", map[string]uint32{"dx": 3, "dy": 0}, a, b, c, d)
	t.Logf("every replica served v2 %v after the new replica started", took.Round(time.Millisecond))
	a.stop(t)
	b = restart(b) // an old pod restarts mid-rollout: its files are older
	line := b.waitLog(t, "older than the version of them in force", 1)
	t.Logf("the old replica restarted: %s", line)
	waitLimits(t, "v2 after an old replica restarted", map[string]uint32{"dx": 3, "dy": 0}, b, c, d)
	e := pod("e", v2)
	b.stop(t)
	c.stop(t)
	f := pod("f", v2)
	waitLimits(t, "v2 after the rollout", map[string]uint32{"dx": 3, "dy": 0}, d, e, f)

	// A ConfigMap update in place reaches a pod's files; its watch puts
	// them in force everywhere.
	writePolicies(t, filepath.Join(d.cmd.Dir, "policies"), map[string]int{"dx": 4})
	waitLimits(t, "a file changed in place", map[string]uint32{"dx": 4}, d, e, f)
	// A refused file changes nothing, and its replica says so.
	if err := os.WriteFile(filepath.Join(e.cmd.Dir, "policies", "dx.yaml"), []byte("domain: dx\ndescriptors: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	line = e.waitLog(t, "policy files changed: refused the -policy files; the policies in force stay", 1)
	t.Logf("a bad file: %s", line)
	waitLimits(t, "after a refused file", map[string]uint32{"dx": 4}, d, e, f)

	// A rollback: new pods with the old files.
	g := pod("g", v1)
	waitLimits(t, "the rollback", map[string]uint32{"dx": 10, "dy": 5}, d, e, f, g)
}

// startPod starts a replica in dir, with -policy policies as the chart
// gives it.
func startPod(t *testing.T, dir, name string, env []string) *replica {
	t.Helper()
	p, rec := startBinaryIn(t, dir, env, "-policy", "policies", "-policy-watch", "200ms")
	return &replica{name, p, rec["grpc"].(string)}
}
