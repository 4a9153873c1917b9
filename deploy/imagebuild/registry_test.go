package imagebuild_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluicehq/sluice/deploy/imagebuild"
)

// pushed is where TestRegistry left the images: a loopback registry and
// the references by digest.
type pushed struct {
	host                         string
	controlPlane, filter, native name.Digest
}

// serveRegistry starts an OCI registry (go-containerregistry's
// pkg/registry) on a loopback port for the test.
func serveRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// push pushes both images to a loopback registry and returns their
// references by digest.
func push(t *testing.T, imgs imagebuild.Images) pushed {
	t.Helper()
	host := serveRegistry(t)
	p := pushed{host: host}
	ctx := t.Context()
	d, err := imagebuild.Push(ctx, host+"/sluice/sluice-controlplane:"+version(t), imgs.ControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	p.controlPlane, err = name.NewDigest(host + "/sluice/sluice-controlplane@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	d, err = imagebuild.Push(ctx, host+"/sluice/sluice-filter:"+version(t), imgs.Filter)
	if err != nil {
		t.Fatal(err)
	}
	if p.filter, err = name.NewDigest(host + "/sluice/sluice-filter@" + d.String()); err != nil {
		t.Fatal(err)
	}
	if d, err = imagebuild.Push(ctx, host+"/sluice/sluice-native:"+version(t), imgs.Native); err != nil {
		t.Fatal(err)
	}
	if p.native, err = name.NewDigest(host + "/sluice/sluice-native@" + d.String()); err != nil {
		t.Fatal(err)
	}
	return p
}

func version(t *testing.T) string {
	t.Helper()
	v, err := imagebuild.ReadVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRegistry pushes both images to a registry on loopback and pulls them
// back by digest with go-containerregistry's remote client (what Istio's
// and Envoy Gateway's Wasm fetchers use, and what a runtime resolves by
// platform), then checks media types, platforms, entrypoint, user,
// annotations, the files each platform carries and the compat variant.
func TestRegistry(t *testing.T) {
	imgs := images(t)
	p := push(t, imgs)
	want := version(t)

	// The control plane: an OCI index of linux/amd64 and linux/arm64.
	desc, err := remote.Get(p.controlPlane)
	if err != nil {
		t.Fatal(err)
	}
	if desc.MediaType != types.OCIImageIndex {
		t.Errorf("control plane: media type %s, want %s", desc.MediaType, types.OCIImageIndex)
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.String())
		if m.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s: manifest media type %s", m.Platform, m.MediaType)
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
	checkAnnotations(t, "index", im.Annotations, want)
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, plat := range imagebuild.Platforms {
		img, err := remote.Image(p.controlPlane, remote.WithPlatform(plat))
		if err != nil {
			t.Fatal(err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if m.Config.MediaType != types.OCIConfigJSON {
			t.Errorf("%s: config media type %s", plat, m.Config.MediaType)
		}
		for _, l := range m.Layers {
			if l.MediaType != types.OCILayer {
				t.Errorf("%s: layer media type %s", plat, l.MediaType)
			}
		}
		checkAnnotations(t, plat.String(), m.Annotations, want)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		if cf.OS != plat.OS || cf.Architecture != plat.Architecture {
			t.Errorf("%s: config says %s/%s", plat, cf.OS, cf.Architecture)
		}
		if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/sluice-controlplane"}) || c.WorkingDir != "/" {
			t.Errorf("%s: user %q, entrypoint %q, working directory %q", plat, c.User, c.Entrypoint, c.WorkingDir)
		}
		checkAnnotations(t, plat.String()+" labels", c.Labels, want)
		files := layerFiles(t, img)
		for _, f := range []string{"usr/local/bin/sluice-controlplane", "usr/local/bin/ratectl"} {
			e, err := elf.NewFile(bytes.NewReader(files[f].data))
			if err != nil {
				t.Errorf("%s: %s: %v", plat, f, err)
				continue
			}
			if e.Machine != machine[plat.Architecture] {
				t.Errorf("%s: %s is built for %v", plat, f, e.Machine)
			}
			if len(e.Progs) > 0 && slices.ContainsFunc(e.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
				t.Errorf("%s: %s is dynamically linked", plat, f)
			}
		}
		if l := files["bin/ratelimit"]; l.link != "../usr/local/bin/sluice-controlplane" {
			t.Errorf("%s: bin/ratelimit links to %q", plat, l.link)
		}
		if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd lacks user 65532:\n%s", plat, files["etc/passwd"].data)
		}
		if n := strings.Count(string(files["etc/ssl/certs/ca-certificates.crt"].data), "BEGIN CERTIFICATE"); n < 100 {
			t.Errorf("%s: the CA bundle holds %d certificates", plat, n)
		}
		for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox"} {
			if _, ok := files[sh]; ok {
				t.Errorf("%s: the image has a shell, %s", plat, sh)
			}
		}
		n, _ := imagebuild.ImageSize(img)
		t.Logf("control plane %s: %s, %d layers, %d bytes", plat, mustDigest(t, img), len(m.Layers), n)
	}

	// The filter: pulled as Istio's and Envoy Gateway's fetchers do
	// (remote.Get, then the descriptor's image), compat variant.
	fdesc, err := remote.Get(p.filter)
	if err != nil {
		t.Fatal(err)
	}
	fimg, err := fdesc.Image()
	if err != nil {
		t.Fatal(err)
	}
	fm, err := fimg.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if fm.MediaType != types.OCIManifestSchema1 || fm.Annotations["module.wasm.image/variant"] != "compat" {
		t.Errorf("filter: media type %s, annotations %v", fm.MediaType, fm.Annotations)
	}
	checkAnnotations(t, "filter", fm.Annotations, want)
	if len(fm.Layers) != 1 || fm.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("filter: layers %+v, want one %s", fm.Layers, types.OCILayer)
	}
	wasm := pluginWasm(t, fimg)
	built, err := os.ReadFile(filepath.Join(workDir, "first", "filter.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wasm, built) || !bytes.HasPrefix(wasm, []byte("\x00asm")) {
		t.Errorf("the pulled plugin.wasm (%d bytes) is not the built filter.wasm (%d bytes)", len(wasm), len(built))
	}
	n, _ := imagebuild.ImageSize(fimg)
	t.Logf("filter: %s, plugin.wasm %d bytes, image %d bytes", p.filter.DigestStr(), len(wasm), n)

	checkNative(t, p.native, machine)
}

// checkNative pulls the native image for each platform, as a kubelet
// resolves an image volume, and checks that it holds, at its root, a
// shared object for that machine that exports Envoy's module entry point,
// and the licence.
func checkNative(t *testing.T, ref name.Digest, machine map[string]elf.Machine) {
	t.Helper()
	for _, plat := range imagebuild.Platforms {
		img, err := remote.Image(ref, remote.WithPlatform(plat))
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != plat.OS || cf.Architecture != plat.Architecture || len(cf.Config.Entrypoint) > 0 {
			t.Errorf("native %s: config says %s/%s, entrypoint %q", plat, cf.OS, cf.Architecture, cf.Config.Entrypoint)
		}
		files := layerFiles(t, img)
		so := files[imagebuild.NativePath]
		e, err := elf.NewFile(bytes.NewReader(so.data))
		if err != nil {
			t.Fatalf("native %s: %s: %v", plat, imagebuild.NativePath, err)
		}
		syms, err := e.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		exports := slices.ContainsFunc(syms, func(s elf.Symbol) bool {
			return s.Name == "envoy_dynamic_module_on_program_init" && s.Section != elf.SHN_UNDEF
		})
		if e.Type != elf.ET_DYN || e.Machine != machine[plat.Architecture] || !exports {
			t.Errorf("native %s: type %v, machine %v, exports on_program_init %v", plat, e.Type, e.Machine, exports)
		}
		if len(files["LICENSE"].data) == 0 {
			t.Errorf("native %s: no LICENSE", plat)
		}
		t.Logf("native %s: %s, libsluice.so %d bytes", plat, mustDigest(t, img), len(so.data))
	}
}

// checkAnnotations checks the OCI annotations every manifest and config carries.
func checkAnnotations(t *testing.T, what string, a map[string]string, version string) {
	t.Helper()
	for k, v := range map[string]string{
		imagebuild.AnnotationVersion:  version,
		imagebuild.AnnotationRevision: meta.Revision,
		imagebuild.AnnotationLicenses: "Apache-2.0",
		imagebuild.AnnotationSource:   "https://github.com/sluicehq/sluice",
	} {
		if a[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, a[k], v)
		}
	}
}

// file is one entry of an image's layers.
type file struct {
	mode int64
	data []byte
	link string
	uid  int
	dir  bool
}

// layerFiles reads every layer of img, in order, into a map by path.
func layerFiles(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	out := map[string]file{}
	tarEntries(t, img, func(h *tar.Header, r io.Reader) {
		f := file{mode: h.Mode, link: h.Linkname, uid: h.Uid, dir: h.Typeflag == tar.TypeDir}
		if h.Typeflag == tar.TypeReg {
			var err error
			if f.data, err = io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
		}
		out[strings.TrimSuffix(h.Name, "/")] = f
	})
	return out
}

// tarEntries calls entry with every entry of img's layers, in order, and
// a reader of its contents.
func tarEntries(t *testing.T, img v1.Image, entry func(h *tar.Header, r io.Reader)) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entry(h, tr)
		}
		rc.Close()
	}
}

// pluginWasm takes plugin.wasm out of a compat-variant Wasm image as the
// fetchers do: the last layer, gzip-compressed tar, the file named
// plugin.wasm.
func pluginWasm(t *testing.T, img v1.Image) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("layers: %v", err)
	}
	rc, err := layers[len(layers)-1].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no plugin.wasm in the layer: %v", err)
		}
		if filepath.Base(h.Name) == "plugin.wasm" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

func mustDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// TestReproducible: a second build of the same sources, into another
// directory, has the same digests.
func TestReproducible(t *testing.T) {
	first := images(t)
	second, err := imagebuild.Build(t.Context(), root, filepath.Join(workDir, "second"), meta)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name string
		a, b interface{ Digest() (v1.Hash, error) }
	}{{"control plane", first.ControlPlane, second.ControlPlane}, {"filter", first.Filter, second.Filter}, {"native", first.Native, second.Native}} {
		da, err := x.a.Digest()
		if err != nil {
			t.Fatal(err)
		}
		db, err := x.b.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if da != db {
			t.Errorf("%s: two builds give %s and %s", x.name, da, db)
		} else {
			t.Logf("%s: both builds %s", x.name, da)
		}
	}
	// And the digest depends on what is built: another revision, another digest.
	m := meta
	m.Revision = "fedcba"
	other, err := imagebuild.Filter(m, []byte("\x00asm"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustDigest(t, first.Filter), mustDigest(t, other); a == b {
		t.Errorf("another revision gives the same digest %s", a)
	}
}
