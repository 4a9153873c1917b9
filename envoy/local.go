package envoy

import (
	_ "embed"
	"fmt"
	"net"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Config is envoy.yaml, the bootstrap users copy: filter.wasm.
//
//go:embed envoy.yaml
var Config []byte

// NativeConfig is envoy-native.yaml, the same with the native filter
// (libsluice.so, found by Envoy in $ENVOY_DYNAMIC_MODULES_SEARCH_PATH).
//
//go:embed envoy-native.yaml
var NativeConfig []byte

// Names in envoy.yaml that Local looks for.
const (
	ListenerName        = "ingress_http"
	ControlPlaneCluster = "sluice_controlplane"
	BackendCluster      = "backend"
)

// Local says where the pieces envoy.yaml names are on this machine.
type Local struct {
	Wasm         string // path of filter.wasm (envoy.yaml: /etc/envoy/filter.wasm)
	Listen       string // host:port of the listener ingress_http; port 0: the kernel picks
	Admin        string // host:port of the admin interface
	ControlPlane string // host:port of the control plane (cluster sluice_controlplane)
	Backend      string // host:port of the backend (cluster backend)
}

// Bootstrap returns text, an Envoy bootstrap in YAML (envoy.yaml or
// envoy-native.yaml), as the JSON-shaped map Envoy reads, with only what
// running it on this machine needs changed: the path of every Wasm module
// and the addresses of the listener, the admin interface and the two
// clusters. Everything else is the file as written (Envoy finds
// envoy-native.yaml's module by name: stack.ModuleSearchPath). It fails
// when text does not have the shape of envoy.yaml (the listener or a
// cluster is missing).
func (l Local) Bootstrap(text []byte) (map[string]any, error) {
	var b map[string]any
	if err := yaml.Unmarshal(text, &b); err != nil {
		return nil, fmt.Errorf("envoy.yaml: %w", err)
	}
	if err := setAddress(b, l.Admin, "admin", "address"); err != nil {
		return nil, err
	}
	sr, _ := b["static_resources"].(map[string]any)
	found := 0
	for _, x := range list(sr["listeners"]) {
		ln, _ := x.(map[string]any)
		if ln["name"] != ListenerName {
			continue
		}
		found++
		if err := setAddress(ln, l.Listen, "address"); err != nil {
			return nil, err
		}
		walk(ln, func(m map[string]any) {
			if loc, ok := m["local"].(map[string]any); ok && l.Wasm != "" {
				if _, ok := loc["filename"]; ok {
					loc["filename"] = l.Wasm
				}
			}
		})
	}
	for _, x := range list(sr["clusters"]) {
		c, _ := x.(map[string]any)
		addr := ""
		switch c["name"] {
		case ControlPlaneCluster:
			addr = l.ControlPlane
		case BackendCluster:
			addr = l.Backend
		default:
			continue
		}
		found++
		for _, e := range list(dig(c, "load_assignment", "endpoints")) {
			for _, lb := range list(dig(e, "lb_endpoints")) {
				if err := setAddress(lb, addr, "endpoint", "address"); err != nil {
					return nil, err
				}
			}
		}
	}
	if found != 3 {
		return nil, fmt.Errorf("envoy.yaml: want the listener %s and the clusters %s and %s", ListenerName, ControlPlaneCluster, BackendCluster)
	}
	return b, nil
}

// setAddress sets the socket_address under path in m to hostport (unchanged
// when hostport is empty).
func setAddress(m any, hostport string, path ...string) error {
	if hostport == "" {
		return nil
	}
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("envoy: address %q: %w", hostport, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("envoy: address %q: %w", hostport, err)
	}
	sa, ok := dig(m, append(path, "socket_address")...).(map[string]any)
	if !ok {
		return fmt.Errorf("envoy.yaml: no %v.socket_address", path)
	}
	sa["address"], sa["port_value"] = host, port
	return nil
}

// dig returns the value under path in nested maps, nil when absent.
func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// list returns v as a list (nil when it is not one).
func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// walk calls fn on every map inside v, v included.
func walk(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, y := range x {
			walk(y, fn)
		}
	case []any:
		for _, y := range x {
			walk(y, fn)
		}
	}
}
