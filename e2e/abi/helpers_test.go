package abi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// programs are built once for the package's tests.
var (
	buildOnce sync.Once
	built     stack.Programs
	guestWasm string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// programs returns sluice-controlplane, filter.wasm and the guest module.
func programs(t *testing.T) (stack.Programs, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	buildOnce.Do(func() {
		ctx := context.Background()
		buildDir, buildErr = os.MkdirTemp("", "sluice-abi-")
		if buildErr != nil {
			return
		}
		if built, buildErr = stack.Build(ctx, buildDir); buildErr != nil {
			return
		}
		root, err := stack.ModuleRoot(ctx)
		if err != nil {
			buildErr = err
			return
		}
		guestWasm = filepath.Join(buildDir, "guest.wasm")
		cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", guestWasm, "./e2e/abi/testdata/guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build the guest: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built, guestWasm
}

// policyFile writes a policy YAML into dir.
func policyFile(t *testing.T, dir, text string) string {
	t.Helper()
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// backends starts a control plane on the policy text (memory store) and an
// upstream, both stopped when the test ends.
func backends(t *testing.T, ctx context.Context, progs stack.Programs, dir, policy string) (*stack.ControlPlane, *stack.Upstream) {
	t.Helper()
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{Binary: progs.ControlPlane, Dir: dir,
		Policies: []string{policyFile(t, dir, policy)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(context.Background()) })
	return cp, up
}

// hostFilter returns filter f running the plugin configuration plugin
// under the name name: a Wasm filter with a root_id of its own.
func hostFilter(f stack.Filter, name string, plugin []byte) stack.M {
	m := f.HTTPFilter(name, plugin)
	if f.Host.Name == stack.ProxyWasm.Name {
		return withRoot(m, name)
	}
	return m
}

// withRoot gives a Wasm filter its own root_id: plugins of one VM with the
// same root_id would share a root context.
func withRoot(f stack.M, rootID string) stack.M {
	cfg := f["typed_config"].(stack.M)["config"].(stack.M)
	cfg["root_id"] = rootID
	return f
}

// answer is one response: status and headers.
type answer struct {
	code   int
	header http.Header
}

// get sends GET url with the headers (name, value, ...) on client.
func get(t *testing.T, client *http.Client, url string, kv ...string) answer {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return answer{resp.StatusCode, resp.Header}
}

// counters reads the filter's counters.
func counters(t *testing.T, e *stack.Envoy) map[string]int64 {
	t.Helper()
	s, err := e.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor polls cond every 20 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
