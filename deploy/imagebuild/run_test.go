package imagebuild_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/deploy/internal/envoybin"
	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/envoy"
)

// hostPlatform is the platform of this machine, whose image the tests run.
var hostPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// unpack extracts img's layers, in order, into a new directory, as a
// container runtime builds a root filesystem: files, directories and
// symbolic links with their modes (and owners when running as root).
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // a root filesystem's / is world-readable
	asRoot := os.Geteuid() == 0
	tarEntries(t, img, func(h *tar.Header, r io.Reader) {
		var err error
		clean := path.Clean("/" + h.Name)
		p := filepath.Join(dir, filepath.FromSlash(clean))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, r)
				f.Close()
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		default:
			t.Fatalf("%s: unexpected tar entry type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := os.Chmod(p, os.FileMode(h.Mode&0o777)|modeBits(h.Mode)); err != nil {
				t.Fatal(err)
			}
			if asRoot {
				if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	return dir
}

// modeBits turns a tar header's setuid, setgid and sticky bits into Go's.
func modeBits(m int64) os.FileMode {
	var b os.FileMode
	if m&0o4000 != 0 {
		b |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		b |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		b |= os.ModeSticky
	}
	return b
}

// container is a process started from an unpacked image.
type container struct {
	cmd *exec.Cmd
	out *strings.Builder
}

// startContainer runs argv (paths inside the image) from the unpacked root
// rootfs with the image config's environment and working directory. As
// root it runs as a container would: chrooted into rootfs, as the image's
// user 65532. Otherwise it runs the files under rootfs as the current user.
func startContainer(t *testing.T, rootfs string, cfg v1.Config, argv []string, env ...string) *container {
	t.Helper()
	c := &container{out: &strings.Builder{}}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append([]string{}, cfg.Env...), env...)
	cmd.Stdout, cmd.Stderr = &lockedWriter{b: c.out}, &lockedWriter{b: c.out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		uid, gid := userOf(t, cfg.User)
		cmd.Path = argv[0] // resolved inside the chroot
		cmd.Dir = cfg.WorkingDir
		cmd.SysProcAttr.Chroot = rootfs
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	} else {
		cmd.Path = filepath.Join(rootfs, argv[0])
		cmd.Dir = filepath.Join(rootfs, cfg.WorkingDir)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.cmd = cmd
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return c
}

// userOf parses the image config's "uid:gid".
func userOf(t *testing.T, user string) (uint32, uint32) {
	t.Helper()
	u, g, _ := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil {
		t.Fatalf("image user %q is not uid:gid", user)
	}
	return uint32(uid), uint32(gid)
}

// uid returns the real uid of a running process, from /proc.
func (c *container) uid(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no Uid in /proc status")
	return -1
}

// logMu guards the containers' output.
var logMu sync.Mutex

// lockedWriter appends to a builder under logMu.
type lockedWriter struct {
	b *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return w.b.Write(p)
}

func (c *container) log() string {
	logMu.Lock()
	defer logMu.Unlock()
	return c.out.String()
}

// waitHTTP waits until url answers 200.
func waitHTTP(t *testing.T, c *container, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if c.cmd.ProcessState != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within 60 s; log:\n%s", url, c.log())
}

// shouldRateLimit asks addr for a decision on one descriptor.
func shouldRateLimit(ctx context.Context, addr, domain string, hits uint32, entries ...string) (*rlsv3.RateLimitResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(entries); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: hits})
}

// pulledControlPlane pushes the images to a loopback registry, pulls the
// control plane for this machine's platform by digest and unpacks it.
func pulledControlPlane(t *testing.T) (rootfs string, cfg v1.Config) {
	t.Helper()
	p := push(t, images(t))
	img, err := remote.Image(p.controlPlane, remote.WithPlatform(hostPlatform))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return unpack(t, img), cf.Config
}

// freeAddr returns a free 127.0.0.1 port as host:port.
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := stack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

// TestPulledControlPlaneRuns runs the pulled control plane's entrypoint
// with the image's command, environment, working directory and user (uid
// 65532, chrooted into the unpacked root, when the test runs as root),
// listening on loopback ports, and asks it for decisions: the embedded
// example policies (domain sluice-demo, 10 per 10 s per address) admit one
// hit and refuse a request costing 11. -version prints the stamped version.
func TestPulledControlPlaneRuns(t *testing.T) {
	rootfs, cfg := pulledControlPlane(t)
	out, err := versionOutput(t, rootfs, cfg, cfg.Entrypoint[0])
	if err != nil || !strings.HasPrefix(out, "sluice-controlplane "+version(t)+" (commit "+meta.Revision+", go") {
		t.Errorf("-version: %q (%v)", out, err)
	}
	t.Logf("image's sluice-controlplane -version: %s", strings.TrimSpace(out))
	out, err = versionOutput(t, rootfs, cfg, "/usr/local/bin/ratectl")
	if err != nil || !strings.HasPrefix(out, "ratectl "+version(t)) {
		t.Errorf("ratectl -version: %q (%v)", out, err)
	}

	grpcAddr, httpAddr, policyAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	argv := append(append(append([]string{}, cfg.Entrypoint...), cfg.Cmd...),
		"-grpc-addr="+grpcAddr, "-http-addr="+httpAddr, "-policy-addr="+policyAddr, "-log-format=text")
	c := startContainer(t, rootfs, cfg, argv)
	waitHTTP(t, c, "http://"+httpAddr+"/readyz")
	if os.Geteuid() == 0 {
		if u := c.uid(t); u != 65532 {
			t.Errorf("the control plane runs as uid %d, want 65532", u)
		}
	}
	ctx := t.Context()
	ok, err := shouldRateLimit(ctx, grpcAddr, "sluice-demo", 1, "remote_address", "192.0.2.7")
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v\n%s", err, c.log())
	}
	over, err := shouldRateLimit(ctx, grpcAddr, "sluice-demo", 11, "remote_address", "192.0.2.8")
	if err != nil {
		t.Fatal(err)
	}
	if ok.OverallCode != rlsv3.RateLimitResponse_OK || over.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("decisions %v and %v, want OK and OVER_LIMIT", ok.OverallCode, over.OverallCode)
	}
	js, _ := json.Marshal(ok.Statuses)
	t.Logf("pulled control plane (pid %d, uid %d, %s): 1 hit -> %v %s; 11 hits -> %v", c.cmd.Process.Pid, c.uidOrSelf(t), grpcAddr, ok.OverallCode, js, over.OverallCode)
}

func (c *container) uidOrSelf(t *testing.T) int {
	if os.Geteuid() == 0 {
		return c.uid(t)
	}
	return os.Getuid()
}

// versionOutput runs an image's program with -version.
func versionOutput(t *testing.T, rootfs string, cfg v1.Config, prog string) (string, error) {
	t.Helper()
	cmd := exec.Command(prog, "-version")
	cmd.Env = cfg.Env
	if os.Geteuid() == 0 {
		uid, gid := userOf(t, cfg.User)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		cmd.Dir = "/"
	} else {
		cmd.Path = filepath.Join(rootfs, prog)
	}
	out, err := cmd.Output()
	return string(out), err
}

// TestPulledRatelimitStarts starts the image's /bin/ratelimit, as Envoy
// Gateway's ratelimit Deployment does (no arguments, settings in the
// environment), and checks that it serves decisions on its gRPC port. The
// listen addresses are given both as envoyproxy/ratelimit's variables and as
// sluice's, both on loopback.
func TestPulledRatelimitStarts(t *testing.T) {
	rootfs, cfg := pulledControlPlane(t)
	target, err := os.Readlink(filepath.Join(rootfs, "bin", "ratelimit"))
	if err != nil || path.Clean(path.Join("/bin", target)) != cfg.Entrypoint[0] {
		t.Fatalf("/bin/ratelimit -> %q (%v), want the entrypoint %s", target, err, cfg.Entrypoint[0])
	}
	// The policies where envoyproxy/ratelimit's FILE mode reads them
	// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config), as a mounted ConfigMap
	// puts them: one request per hour per address.
	confDir := filepath.Join(rootfs, "tmp", "ratelimit", "ratelimit", "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	const policy = "domain: sluice-demo\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(confDir, "sluice-demo.yaml"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr, debugAddr, policyAddr, promAddr := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	port := func(a string) string { _, p, _ := strings.Cut(a, ":"); return p }
	c := startContainer(t, rootfs, cfg, []string{"/bin/ratelimit"},
		// envoyproxy/ratelimit's settings, as Envoy Gateway sets them (ports on loopback).
		"HOST=127.0.0.1", "PORT="+port(httpAddr), "GRPC_HOST=127.0.0.1", "GRPC_PORT="+port(grpcAddr),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+port(debugAddr), "USE_STATSD=false", "LOG_LEVEL=info",
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR="+promAddr, "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"RUNTIME_ROOT=/tmp/ratelimit", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		// sluice's own, for a binary that reads only those.
		"SLUICE_GRPC_ADDR="+grpcAddr, "SLUICE_HTTP_ADDR="+httpAddr, "SLUICE_POLICY_ADDR="+policyAddr)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := shouldRateLimit(t.Context(), grpcAddr, "sluice-demo", 1, "remote_address", "192.0.2.9")
		if err == nil {
			t.Logf("/bin/ratelimit (argv[0] /bin/ratelimit) answers on %s: %v", grpcAddr, resp.OverallCode)
			again, err := shouldRateLimit(t.Context(), grpcAddr, "sluice-demo", 1, "remote_address", "192.0.2.9")
			if err != nil || again.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("/bin/ratelimit: the second request of a 1 per hour limit from its FILE-mode policies: %v, %v\n%s", again.GetOverallCode(), err, c.log())
			}
			break
		}
		if c.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("/bin/ratelimit does not answer on %s: %v\n%s", grpcAddr, err, c.log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPulledFilterRuns takes plugin.wasm out of the pulled filter image
// and runs it in real Envoy on envoy/envoy.yaml: `envoy --mode validate`
// accepts it (Envoy loads the module and configures the plugin), then, in
// front of an upstream and the pulled control plane with a policy of one
// request per hour per address, the first request gets 200 and the second
// 429.
func TestPulledFilterRuns(t *testing.T) {
	imgs := images(t)
	p := push(t, imgs)
	desc, err := remote.Get(p.filter)
	if err != nil {
		t.Fatal(err)
	}
	fimg, err := desc.Image()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wasm := filepath.Join(dir, "plugin.wasm")
	if err := os.WriteFile(wasm, pluginWasm(t, fimg), 0o644); err != nil {
		t.Fatal(err)
	}
	envoyBin, err := envoybin.Path(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	b, err := envoy.Local{Wasm: wasm}.Bootstrap(envoy.Config)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(b)
	cfgPath := filepath.Join(dir, "validate.json")
	if err := os.WriteFile(cfgPath, js, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := stack.ValidateEnvoy(ctx, envoyBin, cfgPath); err != nil {
		t.Fatalf("envoy --mode validate refuses envoy.yaml with the pulled plugin.wasm: %v\n%s", err, out)
	}
	t.Logf("envoy --mode validate: envoy/envoy.yaml with the pulled plugin.wasm (%s) accepted", p.filter.DigestStr())

	// The control plane from the pulled image (this machine's platform).
	cpImg, err := remote.Image(p.controlPlane, remote.WithPlatform(hostPlatform))
	if err != nil {
		t.Fatal(err)
	}
	rootfs := unpack(t, cpImg)
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte("domain: sluice-demo\ndescriptors:\n  - key: remote_address\n    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1}\n"), 0o644)
	cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{
		Binary: filepath.Join(rootfs, "usr/local/bin/sluice-controlplane"), Dir: dir, Policies: []string{policy},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	up, err := stack.StartUpstream("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close(context.Background())
	b, err = envoy.Local{Wasm: wasm, Listen: "127.0.0.1:0", ControlPlane: cp.GRPCAddr(), Backend: up.Addr()}.Bootstrap(envoy.Config)
	if err != nil {
		t.Fatal(err)
	}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Binary: envoyBin, Dir: dir, Bootstrap: b, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	var codes []int
	for range 2 {
		resp, err := http.Get(e.URL(envoy.ListenerName) + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 429 {
		t.Fatalf("status codes %v, want [200 429]; Envoy log:\n%s", codes, e.Log())
	}
	if n := up.Total(); n != 1 {
		t.Errorf("the upstream saw %d requests, want 1", n)
	}
	t.Logf("Envoy with the pulled plugin.wasm and the pulled control plane: %v", codes)
}
