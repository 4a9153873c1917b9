package imagebuild

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Images are sluice's images.
type Images struct {
	ControlPlane v1.ImageIndex // linux/amd64 and linux/arm64
	Filter       v1.Image      // filter.wasm, compat variant
	Native       v1.ImageIndex // libsluice.so, linux/amd64 and linux/arm64
}

// Build builds the programs of the sluice module at root (into work, a
// directory for the binaries) and returns the images. The version is m's;
// when m.Version is empty, root's VERSION file gives it.
func Build(ctx context.Context, root, work string, m Meta) (Images, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return Images{}, err
	}
	if m.Version == "" {
		v, err := ReadVersion(root)
		if err != nil {
			return Images{}, err
		}
		m.Version = v
	}
	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		return Images{}, err
	}
	bins, modules := map[string]Binaries{}, map[string][]byte{}
	for _, p := range Platforms {
		b, err := BuildBinaries(ctx, root, m, p, work)
		if err != nil {
			return Images{}, err
		}
		bins[p.String()] = b
		if modules[p.String()], err = BuildNative(ctx, root, p, work); err != nil {
			return Images{}, err
		}
	}
	cp, err := ControlPlane(m, bins, license)
	if err != nil {
		return Images{}, err
	}
	wasm, err := BuildWasm(ctx, root, filepath.Join(work, "filter.wasm"))
	if err != nil {
		return Images{}, err
	}
	f, err := Filter(m, wasm)
	if err != nil {
		return Images{}, err
	}
	native, err := Native(m, modules, license)
	if err != nil {
		return Images{}, err
	}
	return Images{ControlPlane: cp, Filter: f, Native: native}, nil
}

// ReadVersion returns the version in root's VERSION file.
func ReadVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
