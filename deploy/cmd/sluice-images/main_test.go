package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sluicehq/sluice/deploy/imagebuild"
)

// TestPush: `sluice-images push` reads the layouts `build` writes and
// pushes them, with the docker configuration's credentials (none here), to
// <registry>/sluice-controlplane:<version>, <registry>/sluice-filter:<version>
// and <registry>/sluice-native:<version>; the tags resolve to the digests of
// the layouts.
func TestPush(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no credentials from the machine
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	m := imagebuild.Meta{Version: "9.9.9", Revision: "abc", Created: time.Unix(1, 0)}
	cp, err := imagebuild.ControlPlane(m, map[string]imagebuild.Binaries{
		"linux/amd64": {ControlPlane: []byte("cp-amd64"), Ratectl: []byte("r-amd64")},
		"linux/arm64": {ControlPlane: []byte("cp-arm64"), Ratectl: []byte("r-arm64")},
	}, []byte("licence"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := imagebuild.Filter(m, []byte("\x00asm\x01\x00\x00\x00"))
	if err != nil {
		t.Fatal(err)
	}
	nat, err := imagebuild.Native(m, map[string][]byte{"linux/amd64": []byte("so-amd64"), "linux/arm64": []byte("so-arm64")}, []byte("licence"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := imagebuild.WriteLayout(filepath.Join(out, imagebuild.NativeLayout), m.Version, nat); err != nil {
		t.Fatal(err)
	}
	if err := imagebuild.WriteLayout(filepath.Join(out, imagebuild.ControlPlaneLayout), m.Version, cp); err != nil {
		t.Fatal(err)
	}
	if err := imagebuild.WriteLayout(filepath.Join(out, imagebuild.FilterLayout), m.Version, f); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"push", "-from", out, "-registry", host + "/sluice/"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	t.Logf("push printed:\n%s", stdout.String())
	for ref, img := range map[string]interface{ Digest() (v1.Hash, error) }{
		host + "/sluice/sluice-controlplane:9.9.9": cp,
		host + "/sluice/sluice-filter:9.9.9":       f,
		host + "/sluice/sluice-native:9.9.9":       nat,
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(r)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		want, _ := img.Digest()
		if desc.Digest.String() != want.String() {
			t.Errorf("%s: digest %s, want %s", ref, desc.Digest, want)
		}
		if !strings.Contains(stdout.String(), ref+"@"+want.String()) {
			t.Errorf("push did not print %s@%s", ref, want)
		}
	}

	// Without -registry, or without layouts: a clear error.
	stderr.Reset()
	if code := run(context.Background(), []string{"push", "-from", out}, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "REGISTRY=") {
		t.Errorf("push without -registry: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"push", "-from", t.TempDir(), "-registry", host}, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "make images") {
		t.Errorf("push without layouts: exit %d, %q", code, stderr.String())
	}
}
