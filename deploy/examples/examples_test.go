package examples

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	istioext "istio.io/api/extensions/v1alpha1"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/deploy/imagebuild"
	"github.com/sluicehq/sluice/deploy/internal/envoybin"
	"github.com/sluicehq/sluice/deploy/manifests"
	filterconfig "github.com/sluicehq/sluice/filter/core/config"
)

// root is the sluice repository.
const root = "../.."

// files returns the example manifests.
func files(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("*/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no examples (%v)", err)
	}
	return paths
}

// TestDecode decodes every example strictly and checks what each object
// carries beyond Kubernetes' types: plugin configurations with the filter's
// parser, Envoy resources in patches with Envoy's protos (unknown fields
// refused), Envoy Gateway's configuration with its type.
func TestDecode(t *testing.T) {
	for _, path := range files(t) {
		t.Run(path, func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := manifests.DecodeAll(b)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.Kind+"/"+o.Name)
				if err := check(o); err != nil {
					t.Errorf("%s %s: %v", o.Kind, o.Name, err)
				}
			}
			t.Logf("%d objects: %s", len(objs), strings.Join(kinds, " "))
		})
	}
}

// check checks the contents that Kubernetes' types leave open.
func check(o manifests.Object) error {
	switch v := o.Value.(type) {
	case *corev1.ConfigMap:
		if doc, ok := v.Data["envoy-gateway.yaml"]; ok {
			eg, err := manifests.Decode([]byte(doc))
			if err != nil {
				return err
			}
			cfg := eg.Value.(*egv1a1.EnvoyGateway)
			c := cfg.Provider.Kubernetes.RateLimitDeployment.Container
			if c == nil || c.Image == nil || !strings.Contains(*c.Image, "sluice-controlplane") {
				return errEG
			}
		}
	case *manifests.IstioObject:
		switch spec := v.Spec.(type) {
		case *istioext.WasmPlugin:
			js, err := protojson.Marshal(spec.GetPluginConfig())
			if err != nil {
				return err
			}
			if _, err := filterconfig.Parse(js); err != nil {
				return err
			}
		case *istionet.EnvoyFilter:
			for _, p := range spec.GetConfigPatches() {
				js, err := protojson.Marshal(p.GetPatch().GetValue())
				if err != nil {
					return err
				}
				var msg proto.Message
				switch p.GetApplyTo() {
				case istionet.EnvoyFilter_HTTP_FILTER:
					var f struct {
						Name        string          `json:"name"`
						TypedConfig json.RawMessage `json:"typed_config"`
					}
					if err := json.Unmarshal(js, &f); err != nil {
						return err
					}
					js, msg = f.TypedConfig, &anypb.Any{}
				case istionet.EnvoyFilter_VIRTUAL_HOST:
					msg = &routev3.VirtualHost{}
				default:
					continue
				}
				if err := (protojson.UnmarshalOptions{}).Unmarshal(js, msg); err != nil {
					return err
				}
			}
		}
	case *egv1a1.EnvoyExtensionPolicy:
		for _, w := range v.Spec.Wasm {
			if w.Config == nil {
				return errNoConfig
			}
			if _, err := filterconfig.Parse(w.Config.Raw); err != nil {
				return err
			}
		}
		for _, m := range v.Spec.DynamicModule {
			if m.Config == nil {
				return errNoConfig
			}
			if m.FilterName == nil || *m.FilterName != "sluice" {
				return errFilterName
			}
			if _, err := filterconfig.Parse(m.Config.Raw); err != nil {
				return err
			}
		}
	case *egv1a1.EnvoyProxy:
		for _, m := range v.Spec.DynamicModules {
			if m.DoNotClose == nil || !*m.DoNotClose {
				return errDoNotClose
			}
		}
	case *egv1a1.EnvoyPatchPolicy:
		for _, p := range v.Spec.JSONPatches {
			if p.Type != "type.googleapis.com/envoy.config.cluster.v3.Cluster" || p.Operation.Value == nil {
				continue
			}
			if err := (protojson.UnmarshalOptions{}).Unmarshal(p.Operation.Value.Raw, &clusterv3.Cluster{}); err != nil {
				return err
			}
		}
	}
	return nil
}

type exampleError string

func (e exampleError) Error() string { return string(e) }

const (
	errEG         = exampleError("the EnvoyGateway configuration does not set provider.kubernetes.rateLimitDeployment.container.image to sluice-controlplane")
	errNoConfig   = exampleError("a Wasm extension or dynamic module without config")
	errFilterName = exampleError("a dynamic module whose filterName is not \"sluice\"")
	errDoNotClose = exampleError("a dynamic module without doNotClose: true (a Go runtime cannot be unloaded)")
)

// TestChecksFail: the checks above refuse a typo at each level (the
// manifest, the Istio spec, the plugin configuration, an Envoy patch, the
// EnvoyGateway configuration) and name it, so passing means something.
func TestChecksFail(t *testing.T) {
	for _, tt := range []struct {
		file, old, new, want string
	}{
		{"plain-envoy/envoy.yaml", "automountServiceAccountToken: false", "automountServiceAccountTokn: false", "automountServiceAccountTokn"},
		{"istio/wasmplugin.yaml", "imagePullPolicy: IfNotPresent", "imagePulPolicy: IfNotPresent", "imagePulPolicy"},
		{"istio/wasmplugin.yaml", "failure_mode: open", "failure_mod: open", "failure_mod"},
		{"istio/envoyfilter-ratelimit.yaml", "failure_mode_deny: false", "failure_mode_denied: false", "failure_mode_denied"},
		{"istio/envoyfilter-ratelimit.yaml", "- remote_address: {}", "- remote_adress: {}", "remote_adress"},
		{"envoy-gateway/envoyextensionpolicy.yaml", "rootID: sluice", "rootId: sluice", "rootId"},
		{"envoy-gateway/envoyextensionpolicy.yaml", "domain: example", "domian: example", "domian"},
		{"envoy-gateway/envoyextensionpolicy.yaml", "connect_timeout: 0.25s", "connect_timout: 0.25s", "connect_timout"},
		{"envoy-gateway/envoy-gateway-config.yaml", "rateLimitDeployment:", "rateLimitDeploy:", "rateLimitDeploy"},
		{"envoy-gateway/native-module.yaml", "doNotClose: true", "doNotClose: false", "doNotClose"},
		{"envoy-gateway/native-module.yaml", "dynamicModules:", "dynamicModule:", "dynamicModule"},
		{"envoy-gateway/native-module.yaml", "filterName: sluice", "filterName: sluicy", "filterName"},
		{"envoy-gateway/native-module.yaml", "domain: example", "domian: example", "domian"},
	} {
		b, err := os.ReadFile(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Replace(string(b), tt.old, tt.new, 1)
		if bad == string(b) {
			t.Fatalf("%s has no %q", tt.file, tt.old)
		}
		objs, err := manifests.DecodeAll([]byte(bad))
		for _, o := range objs {
			if err == nil {
				err = check(o)
			}
		}
		switch {
		case err == nil:
			t.Errorf("%s with %q passes", tt.file, tt.new)
		case !strings.Contains(err.Error(), tt.want):
			t.Errorf("%s with %q: the error does not name %s: %v", tt.file, tt.new, tt.want, err)
		default:
			t.Logf("%s with %q: %v", tt.file, tt.new, err)
		}
	}
}

// TestImageVersions: every reference to sluice's images in the examples
// names the version `make images` builds (the VERSION file), and each
// example directory names one.
func TestImageVersions(t *testing.T) {
	version, err := imagebuild.ReadVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile(`sluice-(?:controlplane|filter|native)[:@][^\s"']*`)
	perDir := map[string]int{}
	for _, path := range files(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ref.FindAllString(string(b), -1) {
			perDir[filepath.Dir(path)]++
			if !strings.HasSuffix(r, ":"+version) {
				t.Errorf("%s: %s does not name version %s", path, r, version)
			}
		}
	}
	for _, d := range []string{"plain-envoy", "istio", "envoy-gateway"} {
		if perDir[d] == 0 {
			t.Errorf("%s names no sluice image", d)
		}
	}
}

// TestPlainEnvoyValidates runs `envoy --mode validate` on the envoy.yaml of
// each plain-Envoy example with the filter built from this repository in
// place of the image volume's: filter.wasm at the path of plugin.wasm, and
// libsluice.so in the module search path the Deployment sets. Envoy checks
// the configuration, loads the filter and has it check the plugin
// configuration; a copy with a bad failure_mode must be refused.
func TestPlainEnvoyValidates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	envoy, err := envoybin.Path(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct {
		file string
		// build builds the filter into dir and returns what the ConfigMap's
		// envoy.yaml must name, what replaces it, and Envoy's environment.
		build func(t *testing.T, dir string) (old, new string, env []string)
	}{
		{"plain-envoy/envoy.yaml", func(t *testing.T, dir string) (string, string, []string) {
			wasm := filepath.Join(dir, "plugin.wasm")
			if _, err := imagebuild.BuildWasm(context.Background(), mustAbs(t, root), wasm); err != nil {
				t.Fatal(err)
			}
			return "/etc/sluice-filter/plugin.wasm", wasm, nil
		}},
		{"plain-envoy/envoy-native.yaml", func(t *testing.T, dir string) (string, string, []string) {
			p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
			if _, err := imagebuild.BuildNative(context.Background(), mustAbs(t, root), p, dir); err != nil {
				t.Fatal(err)
			}
			// The Deployment's search path, where the image volume puts libsluice.so.
			return "name: sluice", "name: sluice", []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + filepath.Join(dir, p.OS+"-"+p.Architecture)}
		}},
	} {
		t.Run(ex.file, func(t *testing.T) {
			cfg, deployment := plainEnvoy(t, ex.file)
			dir := t.TempDir()
			old, repl, env := ex.build(t, dir)
			if !strings.Contains(cfg, old) {
				t.Fatalf("the ConfigMap's envoy.yaml does not hold %q", old)
			}
			if env != nil && !strings.Contains(deployment, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH") {
				t.Fatal("the Deployment does not set ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
			}
			for name, text := range map[string]string{
				"good": cfg,
				"bad":  strings.Replace(cfg, `"failure_mode": "open"`, `"failure_mode": "ajar"`, 1),
			} {
				var v any
				if err := yaml.Unmarshal([]byte(strings.ReplaceAll(text, old, repl)), &v); err != nil {
					t.Fatal(err)
				}
				js, _ := json.Marshal(v)
				p := filepath.Join(dir, name+".json")
				if err := os.WriteFile(p, js, 0o644); err != nil {
					t.Fatal(err)
				}
				out, err := runValidate(envoy, p, env...)
				switch {
				case name == "good" && err != nil:
					t.Fatalf("Envoy refuses the example: %v\n%s", err, out)
				case name == "bad" && err == nil:
					t.Fatal("Envoy accepts the example with failure_mode ajar: the check cannot fail")
				}
			}
		})
	}
}

// plainEnvoy returns the envoy.yaml of the ConfigMap of a plain-Envoy
// example, and its Deployment as JSON.
func plainEnvoy(t *testing.T, file string) (cfg, deployment string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.DecodeAll(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *corev1.ConfigMap:
			cfg = v.Data["envoy.yaml"]
		case *appsv1.Deployment:
			js, _ := json.Marshal(v)
			deployment = string(js)
		}
	}
	if cfg == "" || deployment == "" {
		t.Fatalf("%s: no ConfigMap with envoy.yaml, or no Deployment", file)
	}
	return cfg, deployment
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
