package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"testing"
	"time"
)

// TestTarGz: entries come out sorted with their parents, with fixed times
// and owners, and the same entries in another order give the same bytes.
func TestTarGz(t *testing.T) {
	mtime := time.Unix(1700000000, 0)
	a := []Entry{
		{Path: "usr/local/bin/x", Mode: 0o755, Data: []byte("x")},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("p")},
		{Path: "bin/y", Symlink: "../usr/local/bin/x"},
		{Path: "home/n", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
	}
	b := []Entry{a[3], a[2], a[1], a[0]}
	ga, err := TarGz(a, mtime)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := TarGz(b, mtime)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ga, gb) {
		t.Fatal("the same entries in another order give other bytes")
	}
	zr, err := gzip.NewReader(bytes.NewReader(ga))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header carries name %q, time %v", zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(mtime) {
			t.Errorf("%s: time %v", h.Name, h.ModTime)
		}
		got = append(got, fmt.Sprintf("%s %c %o %d %s", h.Name, h.Typeflag, h.Mode, h.Uid, h.Linkname))
	}
	want := []string{
		"bin/ 5 755 0 ", "bin/y 2 777 0 ../usr/local/bin/x", "etc/ 5 755 0 ", "etc/passwd 0 644 0 ",
		"home/ 5 755 0 ", "home/n/ 5 700 65532 ", "usr/ 5 755 0 ", "usr/local/ 5 755 0 ",
		"usr/local/bin/ 5 755 0 ", "usr/local/bin/x 0 755 0 ",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entries:\n%q\nwant\n%q", got, want)
	}
}

// TestTarGzRefuses: paths outside the image and duplicates are refused.
func TestTarGzRefuses(t *testing.T) {
	for _, e := range [][]Entry{
		{{Path: "../etc/passwd"}},
		{{Path: "/"}},
		{{Path: "a"}, {Path: "/a"}},
	} {
		if _, err := TarGz(e, time.Time{}); err == nil {
			t.Errorf("TarGz(%+v) succeeds", e)
		}
	}
}

// TestLayerBlob: the layer's blob is TarGz's output unchanged (its digest is
// their sha256), so what is pushed is what was built.
func TestLayerBlob(t *testing.T) {
	e := []Entry{{Path: "plugin.wasm", Mode: 0o644, Data: []byte("\x00asm\x01\x00\x00\x00")}}
	gz, err := TarGz(e, time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	l, err := Layer(e, time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("sha256:%x", sha256.Sum256(gz)); d.String() != want {
		t.Errorf("layer digest %s, want %s", d, want)
	}
	mt, _ := l.MediaType()
	if mt != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("media type %s", mt)
	}
}
