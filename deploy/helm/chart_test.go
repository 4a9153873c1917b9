package helm

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/deploy/manifests"
)

const chartDir = "sluice"

// kubeVersion is the Kubernetes version the chart is rendered and linted
// for (the chart needs 1.30 or later).
var kubeVersion = &chartutil.KubeVersion{Version: "v1.34.0", Major: "1", Minor: "34"}

// valueSets are the documented combinations (docs/kubernetes.md): each is
// rendered, linted and decoded.
var valueSets = map[string]string{
	"default": ``,
	"redis-standalone-password": `
redis: {mode: standalone, addrs: ["redis.db:6379"], passwordSecret: {name: redis-auth}}`,
	"redis-tls": `
redis:
  mode: standalone
  addrs: ["redis.db:6380"]
  passwordSecret: {name: redis-auth, key: password}
  tls: {enabled: true, secretName: redis-client-tls, clientCertificate: true, serverName: redis.db.svc}`,
	"redis-sentinel": `
redis: {mode: sentinel, master: mymaster, addrs: ["sentinel-0.db:26379", "sentinel-1.db:26379", "sentinel-2.db:26379"], username: sluice, passwordSecret: {name: redis-auth}}`,
	"redis-cluster": `
redis: {mode: cluster, addrs: ["redis-cluster-0.db:6379", "redis-cluster-1.db:6379"]}`,
	"redis-tryout": `
redis: {tryout: true}`,
	"hpa": `
autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 12}`,
	"servicemonitor-dashboard": `
metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}, dashboard: {enabled: true}}`,
	"networkpolicy": `
networkPolicy:
  enabled: true
  clients: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}}
  metrics: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}`,
	"tls-token-rlqs": `
grpc: {tls: {enabled: true, secretName: sluice-grpc-tls, requireClientCert: true, clientSAN: envoy.mesh.local}}
policyService: {tokenSecret: {name: sluice-token}}
rlqs: {enabled: true}`,
	"everything": `
image: {digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000"}
redis: {mode: standalone, addrs: ["redis.db:6379"], tls: {enabled: true, secretName: redis-ca}}
grpc: {tls: {enabled: true, secretName: sluice-grpc-tls}}
policyService: {tokenSecret: {name: sluice-token, key: tokens}}
rlqs: {enabled: true}
autoscaling: {enabled: true}
metrics: {serviceMonitor: {enabled: true}, dashboard: {enabled: true}}
networkPolicy: {enabled: true}
resources: {limits: {memory: 2Gi, cpu: "2"}}
extraArgs: ["-deadline=30ms"]`,
}

// loadChart loads the chart from its directory.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// render renders the chart with values (YAML) as `helm install sluice
// --namespace rate-limit` would: schema validation, then the templates.
func render(t *testing.T, ch *chart.Chart, values string) (map[string]string, error) {
	t.Helper()
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kubeVersion
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "sluice", Namespace: "rate-limit", IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// objects decodes every rendered manifest strictly.
func objects(t *testing.T, out map[string]string) []manifests.Object {
	t.Helper()
	var objs []manifests.Object
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		got, err := manifests.DecodeAll([]byte(out[name]))
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out[name])
		}
		objs = append(objs, got...)
	}
	return objs
}

// TestRender renders the chart for each documented combination, decodes
// every object into its Go type (an unknown field fails) and checks what
// each combination promises.
func TestRender(t *testing.T) {
	ch := loadChart(t)
	for _, name := range slices.Sorted(maps.Keys(valueSets)) {
		t.Run(name, func(t *testing.T) {
			out, err := render(t, ch, valueSets[name])
			if err != nil {
				t.Fatal(err)
			}
			objs := objects(t, out)
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.Kind)
			}
			t.Logf("%s: %d objects: %s", name, len(objs), strings.Join(kinds, " "))
			d := deployment(t, objs, "sluice")
			args := d.Spec.Template.Spec.Containers[0].Args
			has := func(flag string) bool { return slices.Contains(args, flag) }
			for _, want := range []string{"-policy=/etc/sluice/policies", "-policy-watch=10s", "-shutdown-timeout=20s"} {
				if !has(want) {
					t.Errorf("args %v lack %s", args, want)
				}
			}
			switch name {
			case "redis-tls":
				for _, want := range []string{"-redis-mode=standalone", "-redis-tls-ca=/etc/sluice/redis-tls/ca.crt", "-redis-tls-cert=/etc/sluice/redis-tls/tls.crt", "-redis-password-file=/etc/sluice/redis-password/password", "-redis-tls-server-name=redis.db.svc"} {
					if !has(want) {
						t.Errorf("args %v lack %s", args, want)
					}
				}
			case "redis-sentinel":
				if !has("-redis-mode=sentinel") || !has("-redis-master=mymaster") || !has("-redis-addrs=sentinel-0.db:26379,sentinel-1.db:26379,sentinel-2.db:26379") {
					t.Errorf("sentinel args %v", args)
				}
			case "redis-tryout":
				if !has("-redis-mode=standalone") || !has("-redis-addrs=sluice-redis:6379") || deployment(t, objs, "sluice-redis") == nil {
					t.Errorf("tryout: args %v", args)
				}
			case "hpa":
				if d.Spec.Replicas != nil {
					t.Errorf("with an HPA the Deployment must not set replicas (got %d)", *d.Spec.Replicas)
				}
			case "tls-token-rlqs":
				for _, want := range []string{"-grpc-tls-cert=/etc/sluice/grpc-tls/tls.crt", "-grpc-client-ca=/etc/sluice/grpc-tls/ca.crt", "-grpc-client-san=envoy.mesh.local", "-policy-token-file=/etc/sluice/token/token", "-rlqs-addr=:8083"} {
					if !has(want) {
						t.Errorf("args %v lack %s", args, want)
					}
				}
			case "default":
				if has("-redis-mode=standalone") || *d.Spec.Replicas != 2 {
					t.Errorf("default: args %v replicas %d", args, *d.Spec.Replicas)
				}
			}
		})
	}
}

// deployment returns the Deployment named name, nil when absent.
func deployment(t *testing.T, objs []manifests.Object, name string) *appsv1.Deployment {
	t.Helper()
	for _, o := range objs {
		if d, ok := o.Value.(*appsv1.Deployment); ok && d.Name == name {
			return d
		}
	}
	if name == "sluice" {
		t.Fatalf("no Deployment %s", name)
	}
	return nil
}

// TestDeploymentContract checks the default Deployment: probes, security,
// graceful termination longer than the drain, -memory-max-bytes derived
// from the memory limit, PDB and spread.
func TestDeploymentContract(t *testing.T) {
	ch := loadChart(t)
	for _, tt := range []struct {
		limit string
		want  string // -memory-max-bytes
	}{
		{"512Mi", "-memory-max-bytes=281857228"}, // (512-64) MiB x 3/5
		{"1Gi", "-memory-max-bytes=603979776"},   // (1024-64) MiB x 3/5
		{"200M", "-memory-max-bytes=79734681"},   // (200e6 - 64 MiB) x 3/5
	} {
		out, err := render(t, ch, "resources: {limits: {memory: "+tt.limit+"}}")
		if err != nil {
			t.Fatal(err)
		}
		objs := objects(t, out)
		d := deployment(t, objs, "sluice")
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		if !slices.Contains(c.Args, tt.want) {
			t.Errorf("limit %s: args %v lack %s", tt.limit, c.Args, tt.want)
		}
		if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("probes: readiness %s, liveness %s", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
		}
		sc := c.SecurityContext
		if !*sc.ReadOnlyRootFilesystem || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container securityContext %+v", sc)
		}
		if *spec.SecurityContext.RunAsUser != 65532 {
			t.Errorf("runAsUser %d", *spec.SecurityContext.RunAsUser)
		}
		drain := 20 + 5 // -shutdown-timeout + preStop sleep
		if int(*spec.TerminationGracePeriodSeconds) <= drain {
			t.Errorf("terminationGracePeriodSeconds %d is not longer than the drain (%d s)", *spec.TerminationGracePeriodSeconds, drain)
		}
		if len(spec.TopologySpreadConstraints) != 2 {
			t.Errorf("topology spread: %d constraints", len(spec.TopologySpreadConstraints))
		}
		var pdb bool
		for _, o := range objs {
			pdb = pdb || o.Kind == "PodDisruptionBudget"
		}
		if !pdb {
			t.Error("no PodDisruptionBudget")
		}
	}
}

// TestBadValues: wrong values fail rendering (as `helm install` would) with
// an error that names the value.
func TestBadValues(t *testing.T) {
	ch := loadChart(t)
	for _, tt := range []struct {
		name, values string
		want         []string // all in the error
	}{
		{"wrong type", `replicaCount: two`, []string{"replicaCount", "integer"}},
		{"unknown key", `redis: {adress: x}`, []string{"adress"}},
		{"unknown Redis mode", `redis: {mode: etcd, addrs: ["r:6379"]}`, []string{"/redis/mode", "memory", "sentinel"}},
		{"Redis TLS without a Secret", `redis: {mode: standalone, addrs: ["r:6379"], tls: {enabled: true}}`, []string{"secretName"}},
		{"Redis TLS with an empty Secret name", `redis: {mode: standalone, addrs: ["r:6379"], tls: {enabled: true, secretName: ""}}`, []string{"secretName"}},
		{"decision TLS without a Secret", `grpc: {tls: {enabled: true}}`, []string{"secretName"}},
		{"Redis without addresses", `redis: {mode: standalone}`, []string{"redis.addrs"}},
		{"Sentinel without master", `redis: {mode: sentinel, addrs: ["s:26379"]}`, []string{"master"}},
		{"bad memory limit", `resources: {limits: {memory: lots}}`, []string{"memory"}},
		{"memory limit too small", `resources: {limits: {memory: 100Mi}}`, []string{"below 128Mi"}},
		{"bad address", `redis: {mode: standalone, addrs: ["redis.db"]}`, []string{"addrs"}},
		{"client SAN without mTLS", `grpc: {tls: {enabled: true, secretName: s, clientSAN: x}}`, []string{"requireClientCert"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, ch, tt.values)
			if err == nil {
				t.Fatalf("values %s render", tt.values)
			}
			t.Logf("%v", err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestLintStrict runs Helm's linter (helm lint --strict: a warning fails)
// for the default values and each combination.
func TestLintStrict(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(valueSets)) {
		vals, err := chartutil.ReadValues([]byte(valueSets[name]))
		if err != nil {
			t.Fatal(err)
		}
		l := lint.AllWithKubeVersion(chartDir, vals, "rate-limit", kubeVersion)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", name, m)
			}
		}
	}
}

// TestVersions: the chart's version and appVersion, and the default image
// tag, are the repository's VERSION.
func TestVersions(t *testing.T) {
	want := repoVersion(t)
	ch := loadChart(t)
	if ch.Metadata.Version != want || ch.Metadata.AppVersion != want {
		t.Errorf("Chart.yaml: version %s, appVersion %s; VERSION says %s", ch.Metadata.Version, ch.Metadata.AppVersion, want)
	}
	out, err := render(t, ch, "")
	if err != nil {
		t.Fatal(err)
	}
	d := deployment(t, objects(t, out), "sluice")
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/sluicehq/sluice-controlplane:"+want {
		t.Errorf("image %s, want tag %s", img, want)
	}
}

// SluiceImageRefs returns the references to sluice's images in a file, and
// fails the test for one whose tag is not the VERSION.
func SluiceImageRefs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := repoVersion(t)
	refs := regexp.MustCompile(`sluice-(?:controlplane|filter)(?::[^\s"'@]*)?`).FindAllString(string(b), -1)
	var out []string
	for _, r := range refs {
		if strings.HasSuffix(path, "values.yaml") && r == "sluice-controlplane" {
			continue // repository: the tag is on its own line
		}
		out = append(out, r)
		if !strings.HasSuffix(r, ":"+want) {
			t.Errorf("%s: image %s does not name version %s", path, r, want)
		}
	}
	return out
}

// repoVersion is the VERSION file's.
func repoVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestPolicies: the policies the chart ships parse with sluice's own parser.
func TestPolicies(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Policies struct {
			Files map[string]string `json:"files"`
		} `json:"policies"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Policies.Files) == 0 {
		t.Fatal("values.yaml ships no policies")
	}
	// Rendered, as the ConfigMap holds them.
	out, err := render(t, loadChart(t), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := 0
	for _, o := range objects(t, out) {
		if cm, ok := o.Value.(*corev1.ConfigMap); ok && cm.Name == "sluice-policies" {
			for name, text := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
	}
	if n != len(v.Policies.Files) {
		t.Fatalf("ConfigMap holds %d files, values.yaml %d", n, len(v.Policies.Files))
	}
	if _, err := policy.Load(dir); err != nil {
		t.Errorf("the chart's policies: %v", err)
	}
	// And a bad one is refused: the check can fail.
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644)
	if _, err := policy.Load(dir); err == nil {
		t.Error("policy.Load accepts a bad unit")
	}
}

// TestDashboard: the chart's copy of the Grafana dashboard is
// dashboards/grafana-sluice.json.
func TestDashboard(t *testing.T) {
	a, err := os.ReadFile(filepath.Join(chartDir, "files", "grafana-sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../dashboards/grafana-sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Error("deploy/helm/sluice/files/grafana-sluice.json differs from dashboards/grafana-sluice.json: copy it again")
	}
}
