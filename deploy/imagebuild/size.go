package imagebuild

import (
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ImageSize returns the bytes a registry stores for img: its manifest, its
// config and its (compressed) layers.
func ImageSize(img v1.Image) (int64, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

// Describe returns one line per image: its digest and size, and for an
// index each platform's.
func Describe(name string, img any) (string, error) {
	var b strings.Builder
	switch x := img.(type) {
	case v1.Image:
		d, err := x.Digest()
		if err != nil {
			return "", err
		}
		n, err := ImageSize(x)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s %s %d bytes\n", name, d, n)
	case v1.ImageIndex:
		d, err := x.Digest()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s %s (index)\n", name, d)
		im, err := x.IndexManifest()
		if err != nil {
			return "", err
		}
		for _, desc := range im.Manifests {
			child, err := x.Image(desc.Digest)
			if err != nil {
				return "", err
			}
			n, err := ImageSize(child)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "  %s %s %d bytes\n", desc.Platform, desc.Digest, n)
		}
	default:
		return "", fmt.Errorf("imagebuild: cannot describe a %T", img)
	}
	return b.String(), nil
}
