// Package version says which build of sluice is running: the release
// version, the source revision and the Go toolchain, stamped into each
// binary at link time.
//
// The Makefile and the image builder set Version and Commit with
//
//	-ldflags "-X github.com/sluicehq/sluice/internal/version.Version=$(cat VERSION)
//	          -X github.com/sluicehq/sluice/internal/version.Commit=$(git rev-parse HEAD)"
//
// A plain `go build` leaves them empty; Get then falls back on what the Go
// toolchain recorded in the binary (the module version and vcs.revision).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time with -ldflags -X; empty in a plain `go build`.
var (
	// Version is the release version, from the VERSION file (e.g. "0.1.0").
	Version string
	// Commit is the source revision the binary was built from.
	Commit string
)

// Info is what -version prints.
type Info struct {
	Version   string // release version, or "devel" when unknown
	Commit    string // source revision, or "unknown"
	GoVersion string // Go toolchain that built the binary
}

// String returns the one line -version prints: program name, version, commit
// and Go version.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}

// Get returns this binary's version information: the link-time values, or
// the build information's where they are empty.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, Commit, bi, runtime.Version())
}

// resolve merges the link-time values with the build information (nil when
// the binary has none).
func resolve(version, commit string, bi *debug.BuildInfo, goVersion string) Info {
	i := Info{Version: version, Commit: commit, GoVersion: goVersion}
	if bi != nil {
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		if i.Commit == "" {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					i.Commit = s.Value
				}
			}
			for _, s := range bi.Settings {
				if s.Key == "vcs.modified" && s.Value == "true" && i.Commit != "" {
					i.Commit += "-dirty"
				}
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	return i
}
