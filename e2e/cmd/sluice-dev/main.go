// Command sluice-dev runs a whole sluice stack on loopback, for trying it
// out: `make run`.
//
// It starts the control plane (the sluice-controlplane binary, built from
// this tree, as a child process) on its embedded memory store with the
// example policies (controlplane/policy/example.yaml, domain sluice-demo),
// or on Redis when REDIS_ADDR is set; a small demo upstream; and a gateway
// running filter.wasm in the proxy-wasm host (e2e/host, the part Envoy plays
// in production) on 127.0.0.1:8080, with a plugin configuration matching the
// example policies (descriptors remote_address, api_key from the x-api-key
// header, path). It prints what runs where, a curl line that hits a limit,
// a ratectl line that changes the limit live, and where the metrics are.
// Ctrl-C (SIGINT) or SIGTERM stops everything.
//
//	sluice-dev [-listen 127.0.0.1:8080] [-wasm build/filter.wasm] [-policy file.yaml] [-v]
//	REDIS_ADDR=127.0.0.1:6379 sluice-dev
//
// Run it from the repository (it builds the control plane with the go
// command, and filter.wasm with wasm-build.sh when the file is missing).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "sluice-dev:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sluice-dev:", err)
		os.Exit(1)
	}
}

// usageError is a bad flag or setting: exit status 2.
type usageError struct{ error }

// options are the flags.
type options struct {
	listen, admin              string // gateway and its admin (filter metrics) listeners
	grpcAddr, httpAddr, polAdr string // control plane listeners
	wasm                       string // filter.wasm
	policy                     string // policy file seeding the store ("" = the example)
	workers                    int    // gateway VMs
	redis                      string // Redis address, from REDIS_ADDR
	verbose                    bool   // logs on stderr
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("sluice-dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "gateway `address` (filter.wasm in front of the demo upstream)")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:9901", "gateway admin `address`: the filter's metrics at /stats/prometheus")
	fs.StringVar(&o.grpcAddr, "grpc-addr", "127.0.0.1:8081", "control plane decision API `address` (RLS gRPC)")
	fs.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:9090", "control plane `address` of /metrics, /healthz, /readyz")
	fs.StringVar(&o.polAdr, "policy-addr", "127.0.0.1:8082", "control plane policy service `address` (ratectl)")
	fs.StringVar(&o.wasm, "wasm", "build/filter.wasm", "filter.wasm `file`, relative to the repository; built when missing")
	fs.StringVar(&o.policy, "policy", "", "policy `file` seeding the control plane (default: controlplane/policy/example.yaml)")
	fs.IntVar(&o.workers, "workers", 2, "gateway worker VMs")
	fs.BoolVar(&o.verbose, "v", false, "show the control plane's and the filter's logs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments %q (every setting is a flag)", fs.Args())}
	}
	if o.workers < 1 || o.workers > 64 {
		return nil, usageError{fmt.Errorf("-workers must be between 1 and 64, not %d", o.workers)}
	}
	o.redis = getenv("REDIS_ADDR")
	return o, nil
}

// run starts the stack, prints how to use it, and stops it when ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	root, err := stack.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "sluice-dev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// Build what is needed.
	wasmPath := o.wasm
	if !filepath.IsAbs(wasmPath) {
		wasmPath = filepath.Join(root, wasmPath)
	}
	if _, err := os.Stat(wasmPath); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stdout, "building %s ...\n", wasmPath)
		if err := stack.BuildWasm(ctx, wasmPath); err != nil {
			return err
		}
	}
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return err
	}
	cpBin := filepath.Join(tmp, "sluice-controlplane")
	fmt.Fprintln(stdout, "building the control plane ...")
	if err := stack.GoBuild(ctx, "./controlplane/cmd/sluice-controlplane", cpBin); err != nil {
		return err
	}

	// The policy service's token, in a file only this user can read.
	tokenFile := filepath.Join(tmp, "token")
	token, err := newToken()
	if err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return err
	}

	var policies []string
	if o.policy != "" {
		policies = []string{o.policy}
	}
	var cpLog io.Writer
	if o.verbose {
		cpLog = stderr
	}
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{
		Binary: cpBin, Dir: tmp, RedisAddr: o.redis, Policies: policies, Token: token,
		GRPCAddr: o.grpcAddr, HTTPAddr: o.httpAddr, PolicyAddr: o.polAdr, Stderr: cpLog,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(stderr, "sluice-dev:", err)
		}
	}()

	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		return err
	}
	defer up.Close(context.Background())

	gwLevel := "warn"
	if o.verbose {
		gwLevel = "info"
	}
	gw, err := stack.StartGateway(ctx, stack.GatewayConfig{
		Addr: o.listen, AdminAddr: o.admin, Wasm: wasm, Plugin: stack.DemoPlugin().JSON(),
		Workers: o.workers, ControlPlane: cp.GRPCAddr(), Upstream: up.URL(),
		CacheDir: filepath.Join(os.TempDir(), "sluice-dev-wazero-cache"), LogLevel: gwLevel, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.Close(sctx)
	}()

	lowered := ""
	if o.policy == "" {
		lowered = filepath.Join(tmp, "sluice-demo-lowered.yaml")
		if err := writeLowered(filepath.Join(root, "controlplane/policy/example.yaml"), lowered, 3); err != nil {
			fmt.Fprintln(stderr, "sluice-dev: cannot prepare the live-change example:", err)
			lowered = ""
		}
	}
	printBanner(stdout, o, cp, gw, up, tokenFile, lowered)

	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping ...")
	return nil
}

// printBanner says what runs and how to use it.
func printBanner(w io.Writer, o *options, cp *stack.ControlPlane, gw *stack.Gateway, up *stack.Upstream, tokenFile, lowered string) {
	store := "embedded memory store"
	if o.redis != "" {
		store = "Redis at " + o.redis + " (policies live there too)"
	}
	pol := "example policies (controlplane/policy/example.yaml, domain " + stack.DemoDomain + ")"
	if o.policy != "" {
		pol = "policies from " + o.policy + " (they seed an empty store)"
	}
	ratectl := "go run ./controlplane/cmd/ratectl --server " + cp.PolicyAddr() + " --rls-server " + cp.GRPCAddr() + " --token-file " + tokenFile
	fmt.Fprintf(w, `
sluice is running (Ctrl-C stops everything):
  gateway        %s   filter.wasm, %d worker VMs, in front of the demo upstream %s
  control plane  %s   decisions (RLS gRPC), pid %d, %s
                 %s   policy service (ratectl), token in %s
                 %s   /metrics /healthz /readyz
  policies       %s
  logs           control plane: %s

Hit the per-address limit (10 requests per 10 s window):
  for i in $(seq 12); do curl -s -o /dev/null -w '%%{http_code}\n' %s/; done
See the headers (RateLimit-Policy, RateLimit, Retry-After):
  curl -i %s/
`, gw.Addr(), o.workers, up.Addr(),
		cp.GRPCAddr(), cp.PID(), store,
		cp.PolicyAddr(), tokenFile,
		cp.HTTPURL(),
		pol, cp.LogPath(),
		gw.URL(), gw.URL())
	if lowered != "" {
		fmt.Fprintf(w, `Change the limit live, no restart (per address: 10 -> 3 per 10 s):
  %s apply -f %s
`, ratectl, lowered)
	}
	fmt.Fprintf(w, `Look at the policies and ask for a decision:
  %s get %s
  %s check %s remote_address=127.0.0.1
Metrics:
  control plane  %s/metrics
  filter         %s
`, ratectl, stack.DemoDomain, ratectl, stack.DemoDomain, cp.HTTPURL(), gw.MetricsURL())
}

// writeLowered copies the example policy file to out with the per-address
// limit (descriptor remote_address) set to n, keeping the comments, and
// checks that the result is a valid policy.
func writeLowered(example, out string, n int) error {
	src, err := os.ReadFile(example)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return fmt.Errorf("%s: %w", example, err)
	}
	rpu := findPerAddress(&doc)
	if rpu == nil {
		return fmt.Errorf("%s: no requests_per_unit on the remote_address descriptor", example)
	}
	rpu.Value = fmt.Sprint(n)
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if _, err := policy.Parse(out, []byte(b.String())); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}

// findPerAddress returns the requests_per_unit node of the top-level
// descriptor with key remote_address, or nil.
func findPerAddress(doc *yaml.Node) *yaml.Node {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	descs := mapValue(doc.Content[0], "descriptors")
	if descs == nil || descs.Kind != yaml.SequenceNode {
		return nil
	}
	for _, d := range descs.Content {
		if k := mapValue(d, "key"); k != nil && k.Value == "remote_address" && mapValue(d, "value") == nil {
			if rl := mapValue(d, "rate_limit"); rl != nil {
				return mapValue(rl, "requests_per_unit")
			}
		}
	}
	return nil
}

// mapValue returns the value of key in mapping node m, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// newToken returns a random bearer token for the policy service.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
