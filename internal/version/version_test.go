package version

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}
		for i := 0; i+1 < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	for _, tt := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{"link-time values win", "0.1.0", "abc", vcs("vcs.revision", "def"), Info{"0.1.0", "abc", "go1.26.8"}},
		{"vcs.revision as fallback", "0.1.0", "", vcs("vcs.revision", "def"), Info{"0.1.0", "def", "go1.26.8"}},
		{"modified tree", "", "", vcs("vcs.revision", "def", "vcs.modified", "true"), Info{"devel", "def-dirty", "go1.26.8"}},
		{"module version from go install", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}}, Info{"v0.1.0", "unknown", "go1.26.8"}},
		{"nothing known", "", "", nil, Info{"devel", "unknown", "go1.0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve(tt.version, tt.commit, tt.bi, "go1.0"); got != tt.want {
				t.Errorf("resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	got := Info{"0.1.0", "abc", "go1.26.8"}.String()
	if want := "0.1.0 (commit abc, go1.26.8)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
