// Command sluice-images builds sluice's container images as OCI image
// layouts and pushes them to a registry, without a Docker daemon
// (`make images`, `make push`).
//
//	sluice-images build -root .. -out ../build/images [-revision SHA] [-created UNIX]
//	sluice-images push -from ../build/images -registry registry.example.com/sluice
//
// build writes <out>/controlplane (an index: linux/amd64, linux/arm64),
// <out>/filter (filter.wasm, compat variant) and <out>/native (libsluice.so,
// an index: linux/amd64, linux/arm64) and prints their digests and sizes.
// push sends them as <registry>/sluice-controlplane:<version>,
// <registry>/sluice-filter:<version> and <registry>/sluice-native:<version>,
// with the credentials of the docker configuration (~/.docker/config.json,
// $DOCKER_CONFIG).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sluicehq/sluice/deploy/imagebuild"
)

// Repository names under -registry.
const (
	ControlPlaneRepo = "sluice-controlplane"
	FilterRepo       = "sluice-filter"
	NativeRepo       = "sluice-native"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs one subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: sluice-images build|push [flags] (see -h of each)")
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = build(ctx, args[1:], stdout, stderr)
	case "push":
		err = push(ctx, args[1:], stdout, stderr)
	default:
		err = fmt.Errorf("unknown command %q: want build or push", args[0])
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintln(stderr, "sluice-images:", err)
		return 1
	}
}

func build(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice-images build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", "..", "the sluice repository")
	out := fs.String("out", "../build/images", "where the OCI image layouts go")
	revision := fs.String("revision", "", "source revision stamped into the binaries and images (default: unknown)")
	created := fs.Int64("created", 0, "every timestamp in the images, in Unix seconds (the commit's time; $SOURCE_DATE_EPOCH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *created == 0 {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			if _, err := fmt.Sscan(s, created); err != nil {
				return fmt.Errorf("$SOURCE_DATE_EPOCH=%q: %v", s, err)
			}
		}
	}
	if *revision == "" {
		*revision = "unknown"
	}
	version, err := imagebuild.ReadVersion(*root)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "sluice-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	m := imagebuild.Meta{Version: version, Revision: *revision, Created: time.Unix(*created, 0).UTC()}
	imgs, err := imagebuild.Build(ctx, *root, work, m)
	if err != nil {
		return err
	}
	for _, x := range []struct {
		dir string
		img any
	}{{imagebuild.ControlPlaneLayout, imgs.ControlPlane}, {imagebuild.FilterLayout, imgs.Filter}, {imagebuild.NativeLayout, imgs.Native}} {
		dir := filepath.Join(*out, x.dir)
		if err := imagebuild.WriteLayout(dir, version, x.img); err != nil {
			return err
		}
		d, err := imagebuild.Describe(dir, x.img)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, d)
	}
	return nil
}

func push(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice-images push", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "../build/images", "the OCI image layouts `make images` wrote")
	registry := fs.String("registry", "", "registry and path to push to, e.g. registry.example.com/sluice")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *registry == "" {
		return errors.New("push: give -registry (make push REGISTRY=registry.example.com/sluice)")
	}
	for _, x := range []struct{ dir, repo string }{
		{imagebuild.ControlPlaneLayout, ControlPlaneRepo},
		{imagebuild.FilterLayout, FilterRepo},
		{imagebuild.NativeLayout, NativeRepo},
	} {
		img, version, err := imagebuild.ReadLayout(filepath.Join(*from, x.dir))
		if err != nil {
			return fmt.Errorf("push: %w (run make images first)", err)
		}
		ref := strings.TrimSuffix(*registry, "/") + "/" + x.repo + ":" + version
		d, err := imagebuild.Push(ctx, ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		fmt.Fprintf(stdout, "%s@%s\n", ref, d)
	}
	return nil
}
