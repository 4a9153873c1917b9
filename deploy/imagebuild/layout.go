package imagebuild

import (
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Layout directory names under the output directory (build/images).
const (
	ControlPlaneLayout = "controlplane"
	FilterLayout       = "filter"
	NativeLayout       = "native"
)

// WriteLayout writes img (a v1.Image or v1.ImageIndex) as the only entry of
// a fresh OCI image layout at dir, named version
// (org.opencontainers.image.ref.name). What was at dir is removed.
func WriteLayout(dir, version string, img any) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	opt := layout.WithAnnotations(map[string]string{AnnotationRefName: version})
	switch x := img.(type) {
	case v1.ImageIndex:
		return p.AppendIndex(x, opt)
	case v1.Image:
		return p.AppendImage(x, opt)
	default:
		return fmt.Errorf("imagebuild: cannot write a %T", img)
	}
}

// ReadLayout returns the entry of the layout at dir (a v1.Image or a
// v1.ImageIndex) and its version (ref.name).
func ReadLayout(dir string) (img any, version string, err error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", err
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	if len(im.Manifests) != 1 {
		return nil, "", fmt.Errorf("%s: want one entry in index.json, found %d", dir, len(im.Manifests))
	}
	d := im.Manifests[0]
	version = d.Annotations[AnnotationRefName]
	if version == "" {
		return nil, "", fmt.Errorf("%s: the entry has no %s", dir, AnnotationRefName)
	}
	switch {
	case d.MediaType.IsIndex():
		img, err = ii.ImageIndex(d.Digest)
	case d.MediaType.IsImage():
		img, err = ii.Image(d.Digest)
	default:
		err = fmt.Errorf("%s: entry of media type %s", dir, d.MediaType)
	}
	return img, version, err
}
