package imagebuild

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Binaries are one platform's programs.
type Binaries struct {
	ControlPlane []byte // sluice-controlplane
	Ratectl      []byte // ratectl
}

// ControlPlaneCmd is the image's default arguments: listen on every
// interface (the binary's defaults are loopback). The chart passes its own.
var ControlPlaneCmd = []string{"-grpc-addr=:8081", "-http-addr=:9090", "-policy-addr=:8082"}

// ControlPlane returns the control plane's image index: one image per
// entry of bins (keyed by platform, in Platforms order), each from scratch
// with a base layer shared by every platform (users, CA bundle, licence)
// and a layer of the platform's programs. license is the LICENSE file.
func ControlPlane(m Meta, bins map[string]Binaries, license []byte) (v1.ImageIndex, error) {
	base, err := baseEntries(license)
	if err != nil {
		return nil, err
	}
	baseLayer, err := Layer(base, m.Created)
	if err != nil {
		return nil, err
	}
	ann := m.annotations("sluice-controlplane", "sluice's control plane: Envoy's rate limit service (RLS v3, RLQS), policies, ratectl; /bin/ratelimit for Envoy Gateway")
	return platformIndex(ann, func(p v1.Platform) (v1.Image, bool, error) {
		b, ok := bins[p.String()]
		if !ok {
			return nil, false, nil
		}
		binLayer, err := Layer(binaryEntries(b.ControlPlane, b.Ratectl), m.Created)
		if err != nil {
			return nil, false, err
		}
		cfg := v1.Config{
			User:       fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
			Entrypoint: []string{ControlPlanePath},
			Cmd:        ControlPlaneCmd,
			Env:        []string{"PATH=/usr/local/bin:/bin", "SSL_CERT_FILE=" + CABundlePath},
			WorkingDir: "/",
			ExposedPorts: map[string]struct{}{
				"8081/tcp": {}, "8082/tcp": {}, "9090/tcp": {},
			},
			Labels: ann,
		}
		img, err := image(m, p, cfg, ann, []v1.Layer{baseLayer, binLayer}, []string{"base: users, CA bundle, licence", "sluice-controlplane, ratectl, /bin/ratelimit"})
		return img, true, err
	})
}

// NativePath is where the native image holds the module: at its root, so
// that an image volume mounted at dir makes it dir/libsluice.so.
const NativePath = "libsluice.so"

// Native returns the native filter's image index: one image per entry of
// modules (libsluice.so for that platform, keyed like Platforms), each from
// scratch with the module and the licence at its root and nothing to run.
// Kubernetes mounts it as an image volume into Envoy's pod (Envoy Gateway's
// EnvoyProxy, see deploy/examples/envoy-gateway/native-module.yaml).
func Native(m Meta, modules map[string][]byte, license []byte) (v1.ImageIndex, error) {
	ann := m.annotations("sluice-native", "sluice's rate limit filter as an Envoy dynamic module (Envoy 1.40): /libsluice.so")
	return platformIndex(ann, func(p v1.Platform) (v1.Image, bool, error) {
		mod, ok := modules[p.String()]
		if !ok {
			return nil, false, nil
		}
		l, err := Layer([]Entry{{Path: NativePath, Mode: 0o755, Data: mod}, {Path: "LICENSE", Mode: 0o644, Data: license}}, m.Created)
		if err != nil {
			return nil, false, err
		}
		img, err := image(m, p, v1.Config{Labels: ann}, ann, []v1.Layer{l}, []string{"libsluice.so, licence"})
		return img, true, err
	})
}

// platformIndex returns the OCI index of the images platform makes, in
// Platforms order (a platform it reports absent is left out; none at all is
// an error), annotated with ann.
func platformIndex(ann map[string]string, platform func(v1.Platform) (v1.Image, bool, error)) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	added := 0
	for _, p := range Platforms {
		img, ok, err := platform(p)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		pp := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &pp}})
		added++
	}
	if added == 0 {
		return nil, fmt.Errorf("imagebuild: nothing built for any of the platforms %v", Platforms)
	}
	return mutate.Annotations(idx, ann).(v1.ImageIndex), nil
}

// Filter returns filter.wasm as a Wasm image of the compat variant
// (solo-io/wasm spec-compat.md): one application/vnd.oci.image.layer.v1.tar+gzip
// layer holding plugin.wasm, and the annotation module.wasm.image/variant=compat.
// Istio's and Envoy Gateway's image fetchers take the last layer of that
// media type and read plugin.wasm from it.
func Filter(m Meta, wasm []byte) (v1.Image, error) {
	l, err := Layer([]Entry{{Path: "plugin.wasm", Mode: 0o644, Data: wasm}}, m.Created)
	if err != nil {
		return nil, err
	}
	ann := m.annotations("sluice-filter", "sluice's proxy-wasm rate limit filter for Envoy (filter.wasm as plugin.wasm)")
	ann[AnnotationWasmVariant] = "compat"
	cfg := v1.Config{Labels: ann}
	return image(m, v1.Platform{OS: "wasip1", Architecture: "wasm"}, cfg, ann, []v1.Layer{l}, []string{"plugin.wasm"})
}

// image assembles one OCI image: the config file (platform, cfg, Created
// everywhere), the layers with their history, the manifest annotations.
func image(m Meta, p v1.Platform, cfg v1.Config, ann map[string]string, layers []v1.Layer, history []string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: m.Created.UTC()}
	for i, l := range layers {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: history[i]}})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = created
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, ann).(v1.Image), nil
}
