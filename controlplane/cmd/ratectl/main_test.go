package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	"github.com/sluicehq/sluice/internal/portlock"
)

// testToken is the bearer token the test control plane accepts.
const testToken = "ratectl-test-token-0123456789"

// controlPlane is an in-process control plane: the policy service on one
// listener (token required), the decision API on another, fed by the
// policy store as the server wires them.
type controlPlane struct {
	policyAddr string
	rlsAddr    string
	store      *policystore.Store
}

// startControlPlane starts one on free loopback ports, stopped when the test
// ends, with policy files (-policy) that own their domains.
func startControlPlane(t *testing.T, files ...string) *controlPlane {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	b, err := policystore.NewFile(filepath.Join(t.TempDir(), "policies.json"))
	if err != nil {
		t.Fatal(err)
	}
	var srcs []policystore.Source
	if len(files) > 0 {
		if srcs, err = policystore.ReadSources(files...); err != nil {
			t.Fatal(err)
		}
	}
	st, err := policystore.New(context.Background(), b, policystore.Options{Files: srcs, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := rls.New(memory.New(memory.Options{}), st.Current().Set, rls.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		st.Watch(ctx, func(s *policystore.Snapshot) { decisions.SetPolicies(s.Set) })
	}()
	auth, err := policyservice.NewAuthenticator(policyservice.AuthConfig{Tokens: []string{testToken}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	policyServer := grpc.NewServer(auth.ServerOptions()...)
	policyservice.New(st, policyservice.Options{Logger: log}).Register(policyServer)
	rlsServer := grpc.NewServer()
	decisions.Register(rlsServer)
	serve := func(gs *grpc.Server) (string, chan struct{}) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			gs.Serve(ln)
		}()
		return ln.Addr().String(), done
	}
	pAddr, pDone := serve(policyServer)
	rAddr, rDone := serve(rlsServer)
	t.Cleanup(func() {
		stop()
		st.Close()
		policyServer.GracefulStop()
		rlsServer.GracefulStop()
		<-pDone
		<-rDone
		<-watched
	})
	return &controlPlane{policyAddr: pAddr, rlsAddr: rAddr, store: st}
}

// result is one ratectl run.
type result struct {
	code           int
	stdout, stderr string
}

// ratectl runs the command in-process with env as its environment.
func ratectl(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string { return env[k] }
	code := run(context.Background(), args, getenv, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// expect fails the test unless r exited with code and its output holds
// every want (in stdout for code 0, else stderr).
func (r result) expect(t *testing.T, what string, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d; want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.stdout, r.stderr)
	}
	text := r.stdout
	if code != 0 {
		text = r.stderr
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s: output lacks %q:\n%s", what, w, text)
		}
	}
}

// writeFile writes content to name in dir and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const apiPolicy = `domain: api
descriptors:
  - key: user
    rate_limit:
      name: per_user
      algorithm: sliding_log
      unit: hour
      requests_per_unit: 3
`

// TestFileOwnedDomain: apply and delete of a domain a -policy file owns
// are refused, naming the file, and change nothing; list and get name the
// owner; --take-over changes it.
func TestFileOwnedDomain(t *testing.T) {
	dir := t.TempDir()
	owned := writeFile(t, dir, "api.yaml", apiPolicy)
	cp := startControlPlane(t, owned)
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_TOKEN": testToken}
	changed := writeFile(t, t.TempDir(), "api.yaml", strings.Replace(apiPolicy, "requests_per_unit: 3", "requests_per_unit: 9", 1))
	ratectl(t, env, "", "apply", "-f", changed).expect(t, "apply", 1, `domain "api" is owned by the policy file `+owned, "nothing was changed")
	ratectl(t, env, "", "delete", "api").expect(t, "delete", 1, `domain "api" is owned by the policy file `+owned)
	ratectl(t, env, "", "list").expect(t, "list", 0, "api     1        "+owned)
	ratectl(t, env, "", "get", "api").expect(t, "get", 0, "owner "+owned, "requests_per_unit: 3")
	ratectl(t, env, "", "apply", "-f", changed, "--take-over").expect(t, "apply --take-over", 0, `domain "api" applied: version 2`)
	ratectl(t, env, "", "list").expect(t, "list after the take-over", 0, "api     2        store")
}

// TestEndToEnd drives every command against a running control plane.
func TestEndToEnd(t *testing.T) {
	cp := startControlPlane(t)
	dir := t.TempDir()
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_RLS_SERVER": cp.rlsAddr, "SLUICE_TOKEN": testToken}
	api := writeFile(t, dir, "api.yaml", apiPolicy)

	ratectl(t, env, "", "apply", "-f", api).expect(t, "apply", 0, `domain "api" applied: version 2`)
	ratectl(t, env, "", "apply", "-f", api).expect(t, "apply again", 0, `domain "api" unchanged at version 2`)

	bad := writeFile(t, dir, "bad.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n")
	ratectl(t, env, "", "apply", "-f", bad).expect(t, "apply of an invalid file", 1,
		"nothing was changed", bad+`:4: domain "api": descriptors[0].rate_limit.unit: `, "fortnight")
	ratectl(t, env, "", "apply", "-f", api, "--expected-version", "1").expect(t, "apply with a stale version", 1,
		"expected version 1 but the store has version 2", "read it again (get)")

	// Credentials: none, wrong, from a file, from the flag.
	noToken := map[string]string{"SLUICE_SERVER": cp.policyAddr}
	ratectl(t, noToken, "", "list").expect(t, "list without a token", 1, "refused by the policy service", "--token-file")
	ratectl(t, noToken, "", "list", "--token", "wrong-token-0123456789abc").expect(t, "list with a wrong token", 1, "invalid bearer token")
	tokenFile := writeFile(t, dir, "token", "# ops token\n"+testToken+"\n")
	ratectl(t, noToken, "", "--token-file", tokenFile, "list").expect(t, "list with --token-file", 0, "api", "(store version 2)")
	ratectl(t, noToken, "", "list", "--token", testToken).expect(t, "list with --token", 0, "api")

	// Apply from stdin, guarded create, then several files.
	web := strings.ReplaceAll(apiPolicy, "domain: api", "domain: web")
	ratectl(t, env, web, "apply", "-f", "-", "--expected-version", "0").expect(t, "apply from stdin", 0, `domain "web" applied: version 3 (stdin)`)
	multi := t.TempDir()
	writeFile(t, multi, "a.yaml", strings.ReplaceAll(apiPolicy, "requests_per_unit: 3", "requests_per_unit: 4"))
	writeFile(t, multi, "b.yml", strings.ReplaceAll(apiPolicy, "domain: api", "domain: batch"))
	writeFile(t, multi, "notes.txt", "not a policy")
	r := ratectl(t, env, "", "apply", "-f", multi, "-o", "json")
	r.expect(t, "apply of a directory", 0)
	var applied []applyResult
	if err := json.Unmarshal([]byte(r.stdout), &applied); err != nil || len(applied) != 2 ||
		applied[0].Domain != "api" || applied[0].Version != 4 || applied[1].Domain != "batch" || applied[1].Version != 5 {
		t.Fatalf("apply -o json: %v\n%s", err, r.stdout)
	}

	// get, in each format.
	ratectl(t, env, "", "get", "web").expect(t, "get", 0, "# domain web, version 3 (store version 5), owner store\ndomain: web\n")
	r = ratectl(t, env, "", "get", "web", "--output", "json")
	r.expect(t, "get -o json", 0)
	var g getOutput
	if err := json.Unmarshal([]byte(r.stdout), &g); err != nil || g.Domain != "web" || g.Version != 3 || g.StoreVersion != 5 || g.YAML != web {
		t.Fatalf("get -o json: %v %+v", err, g)
	}
	r = ratectl(t, env, "", "-o", "yaml", "get", "web")
	r.expect(t, "get -o yaml", 0)
	var gy map[string]any
	if err := yaml.Unmarshal([]byte(r.stdout), &gy); err != nil || gy["domain"] != "web" || gy["yaml"] != web || gy["version"] != 3 {
		t.Fatalf("get -o yaml: %v %v\n%s", err, gy, r.stdout)
	}
	ratectl(t, env, "", "get", "nope").expect(t, "get of a missing domain", 1, `domain "nope"`, "list")

	// list.
	ratectl(t, env, "", "list").expect(t, "list", 0, "DOMAIN  VERSION  OWNER\napi     4        store\nbatch   5        store\nweb     3        store\n(store version 5)")
	r = ratectl(t, env, "", "list", "-o", "json")
	var l listOutput
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || len(l.Policies) != 3 || l.StoreVersion != 5 {
		t.Fatalf("list -o json: %v\n%s", err, r.stdout)
	}

	// check: the decision API answers with the applied limit, then refuses
	// (an exact sliding log: no window boundary to straddle).
	for i := 0; i < 5; i++ {
		r = ratectl(t, env, "", "check", "api", "user=alice")
	}
	r.expect(t, "check past the limit", 0, "OVER_LIMIT  domain api", "[1] user=alice: OVER_LIMIT  limit 4/hour (per_user)  remaining 0")
	r = ratectl(t, env, "", "check", "api", "user=bob", "+", "other=1", "--hits", "0", "-o", "json")
	var ch checkOutput
	if err := json.Unmarshal([]byte(r.stdout), &ch); err != nil || ch.OverallCode != "OK" || len(ch.Statuses) != 2 ||
		ch.Statuses[0].Limit != "4/hour" || ch.Statuses[0].Remaining != 4 || ch.Statuses[1].Limit != "" {
		t.Fatalf("check -o json: %v\n%s", err, r.stdout)
	}
	ratectl(t, env, "", "check", "api", "user=bob", "+", "other=1").expect(t, "check of two descriptors", 0,
		"OK  domain api", "[1] user=bob: OK  limit 4/hour (per_user)  remaining 3", "[2] other=1: OK  (no limit applies)", "this check consumed 1 hit(s) of the quota, as a request would; --hits 0 only looks")
	if r := ratectl(t, env, "", "check", "api", "user=bob", "--hits", "0"); strings.Contains(r.stdout, "consumed") {
		t.Errorf("check --hits 0 says it consumed quota:\n%s", r.stdout)
	}

	// delete.
	ratectl(t, env, "", "delete", "batch", "--expected-version", "4").expect(t, "delete with a stale version", 1, "expected version 4")
	ratectl(t, env, "", "delete", "batch", "--expected-version", "5").expect(t, "delete", 0, `domain "batch" deleted (store version 6)`)
	ratectl(t, env, "", "delete", "batch").expect(t, "delete again", 1, `domain "batch"`, "no such domain")
}

// TestWatchCommand: watch prints the current state, then each change.
func TestWatchCommand(t *testing.T) {
	cp := startControlPlane(t)
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_TOKEN": testToken}
	ratectl(t, env, apiPolicy, "apply", "-f", "-").expect(t, "apply", 0)

	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var errOut bytes.Buffer
	go func() {
		done <- run(context.Background(), []string{"watch", "--count", "3"}, func(k string) string { return env[k] }, nil, pw, &errOut)
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	next := func() string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch ended early: %s", errOut.String())
		}
		return lines.Text()
	}
	if l := next(); l != "store version 2 (current): api v2" {
		t.Fatalf("first line %q", l)
	}
	ratectl(t, env, strings.ReplaceAll(apiPolicy, "domain: api", "domain: web"), "apply", "-f", "-").expect(t, "apply web", 0)
	if l := next(); l != "store version 3: applied web v3" {
		t.Fatalf("second line %q", l)
	}
	ratectl(t, env, "", "delete", "api").expect(t, "delete api", 0)
	if l := next(); l != "store version 4: deleted api" {
		t.Fatalf("third line %q", l)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("watch --count 3 exited %d: %s", code, errOut.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch --count 3 did not stop after 3 messages")
	}

	// Interrupted: exit 0. JSON: one object per line.
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	pr2, pw2 := io.Pipe()
	go func() {
		done <- run(ctx, []string{"watch", "-o", "json"}, func(k string) string { return env[k] }, nil, pw2, &out)
		pw2.Close()
	}()
	first, err := bufio.NewReader(pr2).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var msg watchOutput
	if err := json.Unmarshal([]byte(first), &msg); err != nil || !msg.Snapshot || msg.StoreVersion != 4 || len(msg.Applied) != 1 {
		t.Fatalf("watch -o json first line: %v %q", err, first)
	}
	cancel()
	go io.Copy(io.Discard, pr2)
	if code := <-done; code != 0 {
		t.Fatalf("interrupted watch exited %d: %s", code, out.String())
	}
}

// TestUsageAndFailures: wrong usage exits 2 and says what to fix; an
// unreachable server exits 1 and names the flag to check.
func TestUsageAndFailures(t *testing.T) {
	env := map[string]string{}
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus", "list"}, "flag provided but not defined: -bogus"},
		{[]string{"list", "--bogus"}, "list: flag provided but not defined: -bogus"},
		{[]string{"list", "extra"}, "list: takes no argument"},
		{[]string{"get"}, "get: want one DOMAIN"},
		{[]string{"delete", "a", "b"}, "delete: want one DOMAIN"},
		{[]string{"apply"}, "apply: no policy file: give -f FILE"},
		{[]string{"apply", "policy.yaml"}, "policy files go after -f"},
		{[]string{"apply", "-f", "a", "-f", "b", "--expected-version", "3"}, ""}, // files missing: exit 1 below
		{[]string{"apply", "-f", "x", "--expected-version", "-1"}, "want a version number"},
		{[]string{"list", "-o", "xml"}, `--output "xml": want text, yaml or json`},
		{[]string{"list", "--token", "a", "--token-file", "b"}, "--token and --token-file both given"},
		{[]string{"list", "--cert", "c.pem"}, "--cert and --key go together"},
		{[]string{"check", "api"}, "check: want DOMAIN and at least one key=value"},
		{[]string{"check", "api", "user"}, `check: "user" is not key=value`},
		{[]string{"check", "api", "+", "a=b"}, "a + separates descriptors"},
		{[]string{"watch", "--count", "-2"}, "--count must be >= 0"},
		{[]string{"help", "nope"}, `help: unknown command "nope"`},
		{[]string{"list", "--timeout", "0s"}, "--timeout must be positive"},
	}
	for _, tc := range cases {
		r := ratectl(t, env, "", tc.args...)
		if tc.want == "" {
			continue
		}
		r.expect(t, strings.Join(tc.args, " "), 2, tc.want)
	}
	ratectl(t, env, "", "help").expect(t, "help", 0, "Commands:", "apply", "check", "Exit codes")
	ratectl(t, env, "", "help", "check").expect(t, "help check", 0, "Usage: ratectl check DOMAIN key=value", "-hits")
	ratectl(t, env, "", "get", "-h").expect(t, "get -h", 0, "Usage: ratectl get DOMAIN")
	ratectl(t, env, "", "apply", "-f", filepath.Join(t.TempDir(), "missing.yaml")).expect(t, "apply of a missing file", 1,
		"missing.yaml: stat: no such file or directory")

	// Nothing listens on a reserved port that nobody binds.
	port, err := portlock.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ratectl(t, env, "", "list", "--server", dead, "--timeout", "2s").expect(t, "list of a dead server", 1,
		"cannot reach the policy service at "+dead, "--server or $SLUICE_SERVER")
	ratectl(t, env, "", "check", "api", "a=b", "--rls-server", dead, "--timeout", "2s").expect(t, "check of a dead server", 1,
		"cannot reach the decision API at "+dead, "--rls-server or $SLUICE_RLS_SERVER")
}

// TestPolicyServiceOff: with the control plane up but its policy service
// not listening (it has no token), the error says so instead of only
// "connection refused".
func TestPolicyServiceOff(t *testing.T) {
	cp := startControlPlane(t)
	port, err := portlock.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ratectl(t, nil, "", "list", "--server", dead, "--rls-server", cp.rlsAddr, "--timeout", "2s").expect(t, "list, policy service off", 1,
		"cannot reach the policy service at "+dead, "its decision API at "+cp.rlsAddr+" answers",
		"policy service is off unless it has a token ($SLUICE_TOKEN or -policy-token-file)")
}

// TestWrongListener: pointing --server at the decision API says so.
func TestWrongListener(t *testing.T) {
	cp := startControlPlane(t)
	env := map[string]string{"SLUICE_TOKEN": testToken}
	ratectl(t, env, "", "list", "--server", cp.rlsAddr).expect(t, "list against the decision API", 1,
		"does not serve the policy service", "is --server the right listener?")
}

// TestApplyStopsAtFirstRefusal: with several files, the ones before a
// refused file are applied, and the output says which were not.
func TestApplyStopsAtFirstRefusal(t *testing.T) {
	cp := startControlPlane(t)
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_TOKEN": testToken}
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", apiPolicy)
	bad := writeFile(t, dir, "b.yaml", "domain: b\nbogus: 1\n")
	writeFile(t, dir, "c.yaml", strings.ReplaceAll(apiPolicy, "domain: api", "domain: c"))
	r := ratectl(t, env, "", "apply", "-f", dir)
	r.expect(t, "apply of a directory with a bad file", 1, bad+": policy rejected", `domain "b": bogus: unknown field`,
		"not applied: "+filepath.Join(dir, "c.yaml"))
	if !strings.Contains(r.stdout, `domain "api" applied: version 2`) {
		t.Fatalf("stdout %q; want a.yaml reported applied", r.stdout)
	}
	if cp.store.Current().Policy("c") != nil {
		t.Fatal("c.yaml was applied after the refusal")
	}
}

// TestApplyRefusesDuplicateDomains: two files that name one domain are
// refused before anything is sent, as -policy refuses them, instead of the
// last one silently winning.
func TestApplyRefusesDuplicateDomains(t *testing.T) {
	cp := startControlPlane(t)
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_TOKEN": testToken}
	dir := t.TempDir()
	a := writeFile(t, dir, "a.yaml", apiPolicy)
	writeFile(t, dir, "b.yaml", strings.ReplaceAll(apiPolicy, "domain: api", "domain: other"))
	c := writeFile(t, dir, "c.yaml", strings.ReplaceAll(apiPolicy, "requests_per_unit: 3", "requests_per_unit: 30"))
	before := cp.store.Current().Version
	ratectl(t, env, "", "apply", "-f", dir).expect(t, "apply of a directory with one domain twice", 1,
		a+" and "+c+` both define domain "api"`, "nothing was applied")
	ratectl(t, env, apiPolicy, "apply", "-f", "-", "-f", c).expect(t, "apply of stdin and a file of one domain", 1,
		"stdin and "+c+` both define domain "api"`)
	if v := cp.store.Current().Version; v != before || cp.store.Current().Policy("api") != nil || cp.store.Current().Policy("other") != nil {
		t.Fatalf("the store changed: version %d -> %d", before, v)
	}
}

// TestFlagsDocumented: every global flag and every command's flag has a
// row in docs/controlplane.md.
func TestFlagsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../docs/controlplane.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(string(b), "\n")
	dash := func(name string) string {
		if len(name) == 1 {
			return "-" + name
		}
		return "--" + name
	}
	has := func(prefix, cell string) bool {
		for _, r := range rows {
			if strings.HasPrefix(r, prefix) && strings.Contains(r, cell) {
				return true
			}
		}
		return false
	}
	fs := flag.NewFlagSet("ratectl", flag.ContinueOnError)
	var g globals
	g.register(fs, func(string) string { return "" })
	fs.VisitAll(func(f *flag.Flag) {
		if !has("| `"+dash(f.Name)+"` |", "") {
			t.Errorf("ratectl's flag %s has no row in docs/controlplane.md", dash(f.Name))
		}
	})
	for _, c := range commands {
		cfs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.setup(cfs)
		cfs.VisitAll(func(f *flag.Flag) {
			found := false
			for _, r := range rows {
				cells := strings.Split(r, "|")
				if len(cells) > 3 && strings.Contains(cells[1], "`"+c.name+"`") && strings.TrimSpace(cells[2]) == "`"+dash(f.Name)+"`" {
					found = true
				}
			}
			if !found {
				t.Errorf("ratectl %s's flag %s has no row in docs/controlplane.md (| `%s` | `%s` | default | meaning |)", c.name, dash(f.Name), c.name, dash(f.Name))
			}
		})
	}
}

// TestApplyRefusesBinaryFiles: a file that is not UTF-8 text (a binary, a
// Latin-1 file) is refused by ratectl itself, naming the file and line,
// before anything is sent: protobuf cannot carry it, and the policy service
// used to be blamed ("failed: Internal").
func TestApplyRefusesBinaryFiles(t *testing.T) {
	cp := startControlPlane(t)
	env := map[string]string{"SLUICE_SERVER": cp.policyAddr, "SLUICE_TOKEN": testToken}
	dir := t.TempDir()
	good := writeFile(t, dir, "a.yaml", apiPolicy)
	latin1 := writeFile(t, dir, "b.yaml", "domain: b\n# caf\xe9\ndescriptors: []\n")
	binary := writeFile(t, t.TempDir(), "c.yaml", "\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe")
	before := cp.store.Current().Version
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a Latin-1 file", []string{"-f", latin1}, latin1 + ":2: not valid UTF-8 text (a binary file?)"},
		{"a binary file", []string{"-f", binary}, binary + ":1: not valid UTF-8 text"},
		{"a directory holding one", []string{"-f", dir}, latin1 + ":2: not valid UTF-8 text"},
		{"standard input", []string{"-f", "-", "-f", good}, "-f -: stdin:1: not valid UTF-8 text"},
	} {
		r := ratectl(t, env, "\xff\xfe", append([]string{"apply"}, c.args...)...)
		r.expect(t, c.name, 1, c.want)
		if strings.Contains(r.stderr, "policy service") || strings.Contains(r.stderr, "Internal") {
			t.Errorf("%s: blames the policy service:\n%s", c.name, r.stderr)
		}
	}
	if v := cp.store.Current().Version; v != before || cp.store.Current().Policy("api") != nil {
		t.Fatalf("the store changed: version %d -> %d", before, v)
	}
}
