package envoy

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	filterconfig "github.com/sluicehq/sluice/filter/config"
)

// readConfig returns the text of envoy.yaml.
func readConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConfigIsValid(t *testing.T) {
	b, err := Load("envoy.yaml", []byte(readConfig(t)))
	if err != nil {
		t.Fatalf("envoy.yaml does not pass Envoy's API checks: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Bootstrap.ValidateAll: %v", err)
	}

	// Listener on 0.0.0.0:10000 with an HTTP connection manager whose last filter is the router.
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 {
		t.Fatalf("got %d listeners, want 1", len(ls))
	}
	sa := ls[0].GetAddress().GetSocketAddress()
	if sa.GetAddress() != "0.0.0.0" || sa.GetPortValue() != 10000 {
		t.Errorf("listener address = %s:%d, want 0.0.0.0:10000", sa.GetAddress(), sa.GetPortValue())
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatalf("listener's first network filter is not an HttpConnectionManager: %v", err)
	}
	hf := hcm.GetHttpFilters()
	if len(hf) != 2 {
		t.Fatalf("got %d HTTP filters, want 2 (wasm, router)", len(hf))
	}
	if hf[0].GetName() != WasmFilterName || !isType(hf[0].GetTypedConfig(), &wasmfilterv3.Wasm{}) {
		t.Errorf("first HTTP filter = %s (%s), want %s", hf[0].GetName(), hf[0].GetTypedConfig().GetTypeUrl(), WasmFilterName)
	}
	if !isType(hf[1].GetTypedConfig(), &routerv3.Router{}) {
		t.Errorf("last HTTP filter = %s, want the router", hf[1].GetTypedConfig().GetTypeUrl())
	}

	// The control-plane cluster speaks HTTP/2.
	cp := findCluster(t, b.GetStaticResources().GetClusters(), "sluice_controlplane")
	if cp.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("sluice_controlplane type = %v, want STRICT_DNS", cp.GetType())
	}
	if d := cp.GetConnectTimeout().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("sluice_controlplane connect_timeout = %v, want a short positive timeout", d)
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	a := cp.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if a == nil {
		t.Fatal("sluice_controlplane has no HttpProtocolOptions")
	}
	if err := a.UnmarshalTo(opts); err != nil {
		t.Fatal(err)
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("sluice_controlplane is not configured for HTTP/2 (explicit_http_config.http2_protocol_options)")
	}
	ep := cp.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if ep.GetAddress() != "127.0.0.1" || ep.GetPortValue() != 8081 {
		t.Errorf("sluice_controlplane endpoint = %s:%d, want 127.0.0.1:8081", ep.GetAddress(), ep.GetPortValue())
	}
}

func TestWasmPlugin(t *testing.T) {
	b, err := Load("envoy.yaml", []byte(readConfig(t)))
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := WasmPlugins(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(plugins) != 1 {
		t.Fatalf("got %d wasm filters, want 1", len(plugins))
	}
	p := plugins[0]
	vm := p.Config.GetConfig().GetVmConfig()
	if vm.GetRuntime() != "envoy.wasm.runtime.v8" {
		t.Errorf("runtime = %q, want envoy.wasm.runtime.v8", vm.GetRuntime())
	}
	if f := vm.GetCode().GetLocal().GetFilename(); !strings.HasSuffix(f, "/filter.wasm") {
		t.Errorf("code.local.filename = %q, want a path to filter.wasm", f)
	}
	if err := checkPluginJSON(p.Configuration); err != nil {
		t.Errorf("plugin configuration: %v\n%s", err, p.Configuration)
	}
}

// checkPluginJSON checks the plugin configuration with the filter's own
// parser, the code proxy_on_configure runs, so the file cannot drift from
// what filter.wasm accepts.
func checkPluginJSON(s string) error {
	_, err := filterconfig.Parse([]byte(s))
	return err
}

// findCluster returns the cluster called name.
func findCluster(t *testing.T, cs []*clusterv3.Cluster, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range cs {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %q", name)
	return nil
}

func TestBrokenConfigs(t *testing.T) {
	good := readConfig(t)
	tests := []struct {
		name     string
		old, new string   // the broken copy replaces old (which must occur once) with new
		want     []string // substrings the error must contain
		line     bool     // the error must give the line of the change
	}{
		{
			name: "unknown field",
			old:  "connect_timeout: 0.25s", new: "connect_timout: 0.25s",
			want: []string{`unknown field "connect_timout"`}, line: true,
		},
		{
			name: "unknown field inside typed_config",
			old:  "runtime: envoy.wasm.runtime.v8", new: "runtim: envoy.wasm.runtime.v8",
			want: []string{`unknown field "runtim"`}, line: true,
		},
		{
			name: "wrong type",
			old:  "port_value: 8081", new: "port_value: eighty",
			want: []string{"portValue", "eighty"}, line: true,
		},
		{
			name: "object where a list belongs",
			old:  `domains: ["*"]`, new: `domains: {any: "*"}`,
			want: []string{"unexpected token {"}, line: true,
		},
		{
			name: "bad enum value",
			old:  "type: STRICT_DNS", new: "type: STRICT_DNZ",
			want: []string{"STRICT_DNZ"}, line: true,
		},
		{
			name: "unregistered type URL",
			old:  "envoy.extensions.filters.http.router.v3.Router", new: "envoy.extensions.filters.http.router.v3.Rooter",
			want: []string{"unable to resolve", "Rooter"}, line: true,
		},
		{
			name: "negative timeout (PGV)",
			old:  "connect_timeout: 0.25s", new: "connect_timeout: -1s",
			want: []string{"ConnectTimeout", "greater than 0s"},
		},
		{
			name: "empty cluster name (PGV)",
			old:  "- name: sluice_controlplane", new: `- name: ""`,
			want: []string{"Cluster.Name", "at least 1 runes"},
		},
		{
			name: "port out of range (PGV)",
			old:  "port_value: 8000", new: "port_value: 70000",
			want: []string{"PortValue", "65535"},
		},
		{
			name: "empty stat_prefix inside typed_config (PGV in Any)",
			old:  "stat_prefix: ingress_http", new: `stat_prefix: ""`,
			want: []string{"static_resources.listeners[0].filter_chains[0].filters[0].typed_config", "StatPrefix"},
		},
		{
			name: "empty wasm file name inside typed_config (PGV in Any)",
			old:  "filename: /etc/envoy/filter.wasm", new: `filename: ""`,
			want: []string{"http_filters[0].typed_config", "Filename", "at least 1 runes"},
		},
		{
			name: "protocol options under the wrong name",
			old:  "      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n", new: "      http2:\n",
			want: []string{"typed_extension_protocol_options", `["http2"]`, `must be "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"`},
		},
		{
			name: "route to an undefined cluster",
			old:  "cluster: backend\n", new: "cluster: backnd\n",
			want: []string{"route.cluster", `"backnd"`},
		},
		{
			name: "plugin calls an undefined cluster",
			old:  `"cluster": "sluice_controlplane"`, new: `"cluster": "sluice_control_plane"`,
			want: []string{"configuration", "sluice_control_plane"},
		},
		{
			name: "plugin configuration not JSON",
			old:  `"domain": "sluice-demo",`, new: `"domain": "sluice-demo",,`,
			want: []string{"not valid JSON"},
		},
		{
			name: "duplicate cluster",
			old:  "\n  - name: backend\n", new: "\n  - name: sluice_controlplane\n",
			want: []string{"defined twice"},
		},
		{
			name: "YAML syntax error",
			old:  "static_resources:\n", new: "static_resources: [\n",
			want: []string{"yaml"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(good, tc.old); n != 1 {
				t.Fatalf("%q occurs %d times in envoy.yaml, want once", tc.old, n)
			}
			broken := strings.Replace(good, tc.old, tc.new, 1)
			_, err := Load("envoy.yaml", []byte(broken))
			if err == nil {
				t.Fatal("broken copy accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
			if tc.line {
				n := strings.Count(good[:strings.Index(good, tc.old)+len(tc.old)-1], "\n") + 1
				if w := fmt.Sprintf("(line %d)", n); !strings.Contains(err.Error(), w) {
					t.Errorf("error does not point at %s:\n%v", w, err)
				}
			}
			if !strings.HasPrefix(err.Error(), "envoy.yaml: ") {
				t.Errorf("error does not name the file: %v", err)
			}
		})
	}
}

func TestBrokenPluginJSON(t *testing.T) {
	const base = `"cluster":"c","domain":"d","rate_limits":[{"actions":[{"path":{}}]}]`
	tests := []struct{ name, json, want string }{
		{"unknown key", `{` + base + `,"extra":1}`, "extra"},
		{"bad failure mode", `{` + base + `,"failure_mode":"maybe"}`, "failure_mode"},
		{"bad timeout", `{` + base + `,"timeout":"-5ms"}`, "timeout"},
		{"unknown action", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"query":{}}]}]}`, "rate_limits[0].actions[0]"},
		{"header action without key", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"request_headers":{"header_name":"x"}}]}]}`, "descriptor_key"},
		{"missing domain", `{"cluster":"c","rate_limits":[{"actions":[{"path":{}}]}]}`, "domain"},
		{"old descriptors shape", `{"cluster":"c","domain":"d","descriptors":[[{"path":{}}]]}`, "descriptors"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPluginJSON(tc.json)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkPluginJSON = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestYAMLToJSON(t *testing.T) {
	tests := []struct {
		name, yaml, want string
		wantErr          string
	}{
		{"scalars", "a: 1\nb: 0.25s\nc: true\nd: null\ne: \"80\"\n", `{"a":1,"b":"0.25s","c":true,"d":null,"e":"80"}`, ""},
		{"alias and merge", "base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n", `{"base":{"x":1,"y":2},"use":{"y":3,"x":1}}`, ""},
		{"list", "l: [1, [2], {k: v}]\n", `{"l":[1,[2],{"k":"v"}]}`, ""},
		{"non-string key", "1: a\n", "", "not a string"},
		{"not finite", "a: .inf\n", "", "no JSON form"},
		{"empty", "", "", "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			js, lines, err := yamlToJSON([]byte(tc.yaml))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.ReplaceAll(string(js), "\n", ""); got != tc.want {
				t.Errorf("json = %s, want %s", got, tc.want)
			}
			if n := strings.Count(string(js), "\n") + 1; n != len(lines) {
				t.Errorf("%d JSON lines but %d line numbers", n, len(lines))
			}
		})
	}
}

func TestYAMLPositions(t *testing.T) {
	// Line 3 of this YAML is the misspelled field; protojson's error must point there.
	_, err := Load("x.yaml", []byte("node:\n  id: a\n  clustr: b\n"))
	if err == nil || !strings.Contains(err.Error(), "(line 3)") || !strings.Contains(err.Error(), "clustr") {
		t.Errorf("err = %v, want one naming clustr at line 3", err)
	}
}

func TestPluginConfigurationTypes(t *testing.T) {
	tests := []struct {
		name    string
		msg     proto.Message
		want    string // the configuration the plugin receives
		wantErr string
	}{
		{"string", wrapperspb.String(`{"domain":"a"}`), `{"domain":"a"}`, ""},
		{"bytes", wrapperspb.Bytes([]byte(`{"domain":"b"}`)), `{"domain":"b"}`, ""},
		{"struct", mustStruct(t, map[string]any{"domain": "c"}), `{"domain":"c"}`, ""},
		{"other type", durationpb.New(time.Second), "", "google.protobuf.Duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Load("envoy.yaml", []byte(readConfig(t)))
			if err != nil {
				t.Fatal(err)
			}
			// Swap the plugin configuration inside the listener's typed configs.
			f := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0]
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			w := &wasmfilterv3.Wasm{}
			if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(w); err != nil {
				t.Fatal(err)
			}
			w.Config.Configuration = mustAny(t, tc.msg)
			hcm.HttpFilters[0].ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, w)}
			f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}

			plugins, err := WasmPlugins(b)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.ReplaceAll(plugins[0].Configuration, " ", ""); got != tc.want {
				t.Errorf("configuration = %s, want %s", got, tc.want)
			}
		})
	}
}

// mustAny wraps m in an Any.
func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// mustStruct returns m as a google.protobuf.Struct.
func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
