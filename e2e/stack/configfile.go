package stack

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
)

// Type URLs of the resources a ConfigFile serves.
const (
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
)

// ConfigFile serves one kind of an Envoy's resources (listeners or
// clusters) from a file, as a control plane would over xDS: Envoy watches
// the file's directory and applies each new version Write puts in place, or
// rejects it (listener_manager.lds.update_rejected,
// cluster_manager.cds.update_rejected) and keeps what it had.
type ConfigFile struct {
	dir     string
	typeURL string
	version int
}

// NewListenerFile returns a ConfigFile of listeners (LDS) in a new
// directory under dir.
func NewListenerFile(dir string) (*ConfigFile, error) { return newConfigFile(dir, listenerType) }

// NewClusterFile returns a ConfigFile of clusters (CDS) in a new directory
// under dir.
func NewClusterFile(dir string) (*ConfigFile, error) { return newConfigFile(dir, clusterType) }

func newConfigFile(dir, typeURL string) (*ConfigFile, error) {
	d, err := os.MkdirTemp(dir, "xds-")
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return &ConfigFile{dir: d, typeURL: typeURL}, nil
}

// path is the file Envoy reads.
func (f *ConfigFile) path() string { return filepath.Join(f.dir, "resources.json") }

// ConfigSource returns the config source that makes Envoy read the file:
// the lds_config or cds_config of the bootstrap's dynamic_resources.
func (f *ConfigFile) ConfigSource() M {
	return M{
		"resource_api_version": "V3",
		"path_config_source":   M{"path": f.path(), "watched_directory": M{"path": f.dir}},
	}
}

// Write replaces the resources with these (HTTPListener's or Cluster's,
// say), as a new version: written aside, then renamed into place, which is
// what Envoy watches for.
func (f *ConfigFile) Write(resources ...M) error {
	f.version++
	res := make([]M, len(resources))
	for i, r := range resources {
		r = maps.Clone(r)
		r["@type"] = f.typeURL
		res[i] = r
	}
	b, err := json.Marshal(M{"version_info": strconv.Itoa(f.version), "resources": res})
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	tmp := filepath.Join(f.dir, "resources.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := os.Rename(tmp, f.path()); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	return nil
}
