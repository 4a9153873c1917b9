package imagebuild

import (
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Meta is what the images say about themselves.
type Meta struct {
	Version  string    // release version, the VERSION file (e.g. "0.1.0")
	Revision string    // source revision (git commit)
	Created  time.Time // every timestamp in the images: the commit's time, for reproducible digests
	Source   string    // source repository URL (default DefaultSource)
}

// DefaultSource is the org.opencontainers.image.source of the images.
const DefaultSource = "https://github.com/sluicehq/sluice"

// Licenses is the SPDX expression of the images' org.opencontainers.image.licenses.
const Licenses = "Apache-2.0"

// Platforms are the control plane image's platforms.
var Platforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
}

// Annotation keys of the OCI image spec (annotations.md) and of the Wasm
// image spec (solo-io/wasm spec-compat.md).
const (
	AnnotationSource      = "org.opencontainers.image.source"
	AnnotationVersion     = "org.opencontainers.image.version"
	AnnotationRevision    = "org.opencontainers.image.revision"
	AnnotationLicenses    = "org.opencontainers.image.licenses"
	AnnotationTitle       = "org.opencontainers.image.title"
	AnnotationDescription = "org.opencontainers.image.description"
	AnnotationCreated     = "org.opencontainers.image.created"
	AnnotationRefName     = "org.opencontainers.image.ref.name"
	AnnotationWasmVariant = "module.wasm.image/variant"
)

// annotations returns the OCI annotations (also used as config labels) of
// an image with this title and description.
func (m Meta) annotations(title, description string) map[string]string {
	src := m.Source
	if src == "" {
		src = DefaultSource
	}
	return map[string]string{
		AnnotationSource:      src,
		AnnotationVersion:     m.Version,
		AnnotationRevision:    m.Revision,
		AnnotationLicenses:    Licenses,
		AnnotationTitle:       title,
		AnnotationDescription: description,
		AnnotationCreated:     m.Created.UTC().Format(time.RFC3339),
	}
}
