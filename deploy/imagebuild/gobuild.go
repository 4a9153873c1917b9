package imagebuild

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// versionPkg is where -ldflags -X stamps the version.
const versionPkg = "github.com/sluicehq/sluice/internal/version"

// LDFlags returns the linker flags of a release binary: no symbol table or
// DWARF, no build id, and the version and revision stamped.
func LDFlags(m Meta) string {
	return fmt.Sprintf("-s -w -buildid= -X %s.Version=%s -X %s.Commit=%s", versionPkg, m.Version, versionPkg, m.Revision)
}

// BuildBinaries cross-compiles sluice-controlplane and ratectl of the sluice
// module at root for platform p (CGO_ENABLED=0, -trimpath, -buildvcs=false,
// LDFlags) into dir, and returns their contents. The go build cache makes a
// second call cheap.
func BuildBinaries(ctx context.Context, root string, m Meta, p v1.Platform, dir string) (Binaries, error) {
	out := filepath.Join(dir, p.OS+"-"+p.Architecture)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Binaries{}, err
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", LDFlags(m), "-o", out + string(filepath.Separator),
		"./controlplane/cmd/sluice-controlplane", "./controlplane/cmd/ratectl"}
	if err := goCmd(ctx, root, []string{"CGO_ENABLED=0", "GOOS=" + p.OS, "GOARCH=" + p.Architecture}, args...); err != nil {
		return Binaries{}, err
	}
	var b Binaries
	var err error
	if b.ControlPlane, err = os.ReadFile(filepath.Join(out, "sluice-controlplane")); err != nil {
		return Binaries{}, err
	}
	if b.Ratectl, err = os.ReadFile(filepath.Join(out, "ratectl")); err != nil {
		return Binaries{}, err
	}
	return b, nil
}

// nativeCC is the C compiler of each platform's native module when it is not
// the machine's own (Debian's cross compilers; `make native-cc ARCH=<arch>`
// installs one).
var nativeCC = map[string]string{"amd64": "x86_64-linux-gnu-gcc", "arm64": "aarch64-linux-gnu-gcc"}

// BuildNative builds the native filter (./filter/native, cgo,
// -buildmode=c-shared, -trimpath, no build id) of the sluice module at root
// for platform p into dir, with the machine's gcc or p's cross compiler, and
// returns its contents.
func BuildNative(ctx context.Context, root string, p v1.Platform, dir string) ([]byte, error) {
	cc := "gcc"
	if p.Architecture != runtime.GOARCH {
		cc = nativeCC[p.Architecture]
	}
	if _, err := exec.LookPath(cc); err != nil {
		return nil, fmt.Errorf("the linux/%s native module needs the C compiler %s (make native-cc ARCH=%s installs it): %w", p.Architecture, cc, p.Architecture, err)
	}
	out := filepath.Join(dir, p.OS+"-"+p.Architecture, "libsluice.so")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, err
	}
	args := []string{"build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -buildid=", "-o", out, "./filter/native"}
	if err := goCmd(ctx, root, []string{"CGO_ENABLED=1", "CC=" + cc, "GOOS=" + p.OS, "GOARCH=" + p.Architecture}, args...); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

// BuildWasm builds filter.wasm of the sluice module at root with its
// wasm-build.sh (upstream Go, wasip1, c-shared, -trimpath) into the file out
// and returns its contents.
func BuildWasm(ctx context.Context, root, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "sh", filepath.Join(root, "wasm-build.sh"), out)
	cmd.Dir = root
	cmd.Env = buildEnv(nil)
	if o, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("wasm-build.sh: %v\n%s", err, o)
	}
	return os.ReadFile(out)
}

// goCmd runs the go command in dir with the environment overridden by env.
func goCmd(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = buildEnv(env)
	var o bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &o
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, o.String())
	}
	return nil
}

// buildEnv returns this process's environment without GOOS, GOARCH,
// CGO_ENABLED, CC and GOFLAGS (which would change what is built), then env.
func buildEnv(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOOS", "GOARCH", "CGO_ENABLED", "CC", "GOFLAGS":
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}
