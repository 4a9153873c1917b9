package stack

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
)

// ListenerFile serves an Envoy's listeners from a file (filesystem LDS):
// Envoy watches the file's directory and applies each new version Write
// puts in place, or rejects it (listener_manager.lds.update_rejected) and
// keeps what it had.
type ListenerFile struct {
	dir     string
	version int
}

// NewListenerFile returns a ListenerFile in a new directory under dir.
func NewListenerFile(dir string) (*ListenerFile, error) {
	d, err := os.MkdirTemp(dir, "lds-")
	if err != nil {
		return nil, fmt.Errorf("listener file: %w", err)
	}
	return &ListenerFile{dir: d}, nil
}

// path is the file Envoy reads.
func (f *ListenerFile) path() string { return filepath.Join(f.dir, "listeners.json") }

// DynamicResources returns the bootstrap's dynamic_resources that make
// Envoy take its listeners from the file.
func (f *ListenerFile) DynamicResources() M {
	return M{"lds_config": M{
		"resource_api_version": "V3",
		"path_config_source":   M{"path": f.path(), "watched_directory": M{"path": f.dir}},
	}}
}

// Write replaces the listeners with these (HTTPListener's, say), as a new
// version: written aside, then renamed into place, which is what Envoy
// watches for.
func (f *ListenerFile) Write(listeners ...M) error {
	f.version++
	res := make([]M, len(listeners))
	for i, l := range listeners {
		r := maps.Clone(l)
		r["@type"] = "type.googleapis.com/envoy.config.listener.v3.Listener"
		res[i] = r
	}
	b, err := json.Marshal(M{"version_info": strconv.Itoa(f.version), "resources": res})
	if err != nil {
		return fmt.Errorf("listener file: %w", err)
	}
	tmp := filepath.Join(f.dir, "listeners.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("listener file: %w", err)
	}
	if err := os.Rename(tmp, f.path()); err != nil {
		return fmt.Errorf("listener file: %w", err)
	}
	return nil
}
