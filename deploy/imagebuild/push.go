package imagebuild

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push writes img (a v1.Image or v1.ImageIndex) to the registry as ref
// (e.g. "registry.example.com/sluice/sluice-controlplane:0.1.0") with opts
// (credentials: remote.WithAuthFromKeychain(authn.DefaultKeychain), the
// docker config's) and returns the digest it is stored under.
func Push(ctx context.Context, ref string, img any, opts ...remote.Option) (v1.Hash, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	opts = append(opts, remote.WithContext(ctx))
	switch x := img.(type) {
	case v1.ImageIndex:
		if err := remote.WriteIndex(r, x, opts...); err != nil {
			return v1.Hash{}, err
		}
		return x.Digest()
	case v1.Image:
		if err := remote.Write(r, x, opts...); err != nil {
			return v1.Hash{}, err
		}
		return x.Digest()
	default:
		return v1.Hash{}, fmt.Errorf("imagebuild: cannot push a %T", img)
	}
}
