package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one file, directory or symbolic link of a layer.
type Entry struct {
	Path    string // inside the image, slash-separated, e.g. "etc/passwd" (a leading / is dropped)
	Mode    int64  // permission bits, e.g. 0o644
	Data    []byte // a regular file's content
	Dir     bool   // a directory
	Symlink string // a symbolic link's target
	UID     int    // owner (0 unless set)
	GID     int    // group (0 unless set)
}

// TarGz returns the gzip-compressed tar of entries: sorted by path, each
// parent directory present (0755, root) unless listed, every time mtime, no
// user or group names, and a gzip header without name or time. The same
// entries always give the same bytes.
func TarGz(entries []Entry, mtime time.Time) ([]byte, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		p := path.Clean(strings.TrimPrefix(e.Path, "/"))
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("imagebuild: entry path %q is outside the image", e.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("imagebuild: entry %q listed twice", p)
		}
		e.Path = p
		byPath[p] = e
	}
	for p := range byPath {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = Entry{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{Name: p, Mode: e.Mode, Uid: e.UID, Gid: e.GID, ModTime: mtime, Format: tar.FormatPAX}
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case e.Symlink != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Symlink
			if h.Mode == 0 {
				h.Mode = 0o777
			}
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Layer returns entries as an OCI layer (application/vnd.oci.image.layer.v1.tar+gzip)
// whose blob is TarGz's output, unchanged.
func Layer(entries []Entry, mtime time.Time) (v1.Layer, error) {
	gz, err := TarGz(entries, mtime)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
