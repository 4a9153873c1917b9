package imagebuild_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/deploy/imagebuild"
)

// root is the sluice repository.
var root, _ = filepath.Abs("../..")

// meta is what the test builds say about themselves.
var meta = imagebuild.Meta{Revision: "0123456789abcdef0123456789abcdef01234567", Created: time.Unix(1795651698, 0).UTC()}

// workDir holds the test builds; TestMain removes it.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-imagebuild-test-")
	if err != nil {
		panic(err)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// built builds both images once per test binary (both platforms'
// binaries cross-compiled, filter.wasm).
var built = sync.OnceValues(func() (imagebuild.Images, error) {
	return imagebuild.Build(context.Background(), root, filepath.Join(workDir, "first"), meta)
})

// images returns the images of built, or skips in short mode.
func images(t *testing.T) imagebuild.Images {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the images")
	}
	imgs, err := built()
	if err != nil {
		t.Fatal(err)
	}
	return imgs
}
