//go:build egstandalone

package gateway

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// nativeExample is the shipped example of sluice's native filter in Envoy
// Gateway, and the module path it names.
const (
	nativeExample     = "../../deploy/examples/envoy-gateway/native-module.yaml"
	nativeExamplePath = "/usr/local/lib/sluice/libsluice.so"
)

// nativeResources are the Gateway API resources of the native example: a
// GatewayClass whose parameters are the example's EnvoyProxy, a Gateway on
// listenerPort, the HTTPRoute "api" to the upstream, and the example's
// EnvoyProxy and EnvoyExtensionPolicy with the module at module.
func nativeResources(t *testing.T, listenerPort int, upstream, module string, edit func(string) string) string {
	t.Helper()
	b, err := os.ReadFile(nativeExample)
	if err != nil {
		t.Fatal(err)
	}
	example := string(b)
	if !strings.Contains(example, nativeExamplePath) {
		t.Fatalf("%s does not load %s", nativeExample, nativeExamplePath)
	}
	example = edit(strings.ReplaceAll(example, nativeExamplePath, module))
	parameters := `  parametersRef:
    group: gateway.envoyproxy.io
    kind: EnvoyProxy
    name: sluice-native
    namespace: default
`
	return egGateway(listenerPort, upstream, parameters) + egRoute("api") + "---\n" + example
}

// prepareHome writes the certificates of Envoy Gateway standalone under
// home, as `envoy-gateway certgen --local` does, and puts the PyPI Envoy
// where func-e looks first (nothing is downloaded). It returns the
// certificates' directory.
func prepareHome(t *testing.T, egBin, home string) string {
	t.Helper()
	cmd := exec.Command(egBin, "certgen", "--local", "--config-home", filepath.Join(home, "config"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("certgen: %v\n%s", err, out)
	}
	copyFile(t, realEnvoy(t), filepath.Join(home, "data", "envoy-versions", egEnvoyVersion, "bin", "envoy"))
	return filepath.Join(home, "config", "certs")
}

// TestRealEnvoyGatewayNativeModule runs Envoy Gateway v1.9.0 standalone on
// the native example, once with the module's Local source (the example's,
// the path of libsluice.so built from this repository) and once with a
// Remote one (Envoy downloads the module from a server on loopback and
// checks its SHA256). Envoy Gateway accepts the EnvoyProxy's dynamicModules
// and the EnvoyExtensionPolicy that refers to them, and its Envoy loads the
// module, which checks the plugin configuration; the route is served
// through it. A configuration with a misspelt field is refused by the
// module: Envoy keeps the previous one and goes on serving.
func TestRealEnvoyGatewayNativeModule(t *testing.T) {
	egBin := os.Getenv("EG_BIN")
	if egBin == "" {
		t.Fatal("set EG_BIN to the envoy-gateway v1.9.0 binary (make e2e-gateway does)")
	}
	dir := t.TempDir()
	module, err := stack.BuildNativeModule(t.Context(), "./filter/native", dir, "sluice")
	if err != nil {
		t.Fatal(err)
	}
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Local", func(t *testing.T) {
		runNativeExample(t, egBin, module, up.Addr(), func(s string) string { return s })
	})
	t.Run("Remote", func(t *testing.T) {
		b, err := os.ReadFile(module)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		var fetched atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fetched.Add(1)
			w.Write(b)
		}))
		defer srv.Close()
		// Envoy keeps a module it fetched in /tmp/envoy_dynamic_module_<sha256>.so
		// and loads that file again without fetching.
		os.Remove(fmt.Sprintf("/tmp/envoy_dynamic_module_%x.so", sum))
		local := fmt.Sprintf("type: Local\n        local:\n          path: %s\n", module)
		remote := fmt.Sprintf("type: Remote\n        remote:\n          url: %s/libsluice.so\n          sha256: %x\n", srv.URL, sum)
		runNativeExample(t, egBin, module, up.Addr(), func(s string) string {
			if !strings.Contains(s, local) {
				t.Fatalf("the example's source is not %q", local)
			}
			return strings.Replace(s, local, remote, 1)
		})
		if fetched.Load() == 0 {
			t.Errorf("Envoy never fetched the module from %s", srv.URL)
		}
	})
}

// runNativeExample starts Envoy Gateway on the native example with the
// module at module, its text changed by source, and checks the module in
// its Envoy, then its refusal of a misspelt field.
func runNativeExample(t *testing.T, egBin, module, upstream string, source func(string) string) {
	dir := t.TempDir()
	home := filepath.Join(dir, "eg")
	res := filepath.Join(dir, "resources")
	os.MkdirAll(res, 0o755)
	prepareHome(t, egBin, home)
	redis := redistest.StartServer(t)
	_, redisPort, _ := strings.Cut(redis.Addr(), ":")
	listenerPort := freePort(t)
	write(t, filepath.Join(res, "resources.yaml"), nativeResources(t, listenerPort, upstream, module, source))
	cfg := filepath.Join(dir, "envoy-gateway.yaml")
	write(t, cfg, egConfig(res, home, "localhost:"+redisPort))
	egLog := filepath.Join(dir, "envoy-gateway.log")
	startProc(t, egLog, []string{"HOME=" + dir}, egBin, "server", "--config-path", cfg)
	logText := func() string { b, _ := os.ReadFile(egLog); return string(b) }
	defer func() {
		if t.Failed() {
			for _, l := range strings.Split(logText(), "\n") {
				if strings.Contains(l, "dynamic") || strings.Contains(l, "sluice") || strings.Contains(l, "error") {
					t.Log(l)
				}
			}
		}
	}()

	hc := &http.Client{Timeout: 10 * time.Second}
	c := &client{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", listenerPort), http: hc}
	took := waitFor(t, "Envoy Gateway's Envoy serving /api through the module", 5*time.Minute, func() bool {
		resp, err := hc.Get(c.base + "/api")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && strings.Contains(logText(), `configuration of domain "example" accepted`)
	})
	t.Logf("Envoy Gateway's Envoy loaded libsluice.so, which accepted the policy's configuration, and serves /api after %v",
		took.Round(time.Second))

	// A misspelt field in the policy's config: the module refuses it, Envoy
	// rejects the listener update and keeps serving on the previous one.
	write(t, filepath.Join(res, "resources.yaml"), nativeResources(t, listenerPort, upstream, module, func(s string) string {
		return strings.Replace(source(s), "domain: example", "domian: example", 1)
	}))
	waitFor(t, "the module's refusal of a misspelt field in Envoy's log", 2*time.Minute, func() bool {
		for _, l := range strings.Split(logText(), "\n") {
			if strings.Contains(l, `filter configuration "sluice" rejected`) && strings.Contains(l, "domian") {
				t.Logf("refused: %s", l)
				return true
			}
		}
		return false
	})
	if code, _ := c.do("GET", "/api"); code != 200 {
		t.Errorf("after the refused update: status %d, want 200 on the previous configuration", code)
	}
}
