package manifests

import (
	"strings"
	"testing"
)

// TestDecodeStrict: each family of types accepts a valid document and
// refuses an unknown field, a field in the wrong case, a duplicate key and
// a wrong type, naming the field.
func TestDecodeStrict(t *testing.T) {
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  ports: [{port: 80}]\n"
	sm := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\nspec:\n  endpoints: [{port: http}]\n  selector: {}\n"
	wp := "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: w}\nspec:\n  url: oci://x/y:1\n  pluginConfig: {a: 1}\n"
	eep := "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyExtensionPolicy\nmetadata: {name: e}\nspec:\n  targetRefs: [{group: g, kind: HTTPRoute, name: r}]\n"
	for _, tt := range []struct {
		name, doc, want string // want "" : valid
	}{
		{"Service", svc, ""},
		{"Service unknown field", strings.Replace(svc, "port: 80", "port: 80, prot: TCP", 1), `unknown field "spec.ports[0].prot"`},
		{"Service wrong case", strings.Replace(svc, "port: 80", "Port: 80", 1), `unknown field "spec.ports[0].Port"`},
		{"Service duplicate key", strings.Replace(svc, "spec:", "spec: {}\nspec:", 1), `"spec"`},
		{"Service wrong type", strings.Replace(svc, "port: 80", "port: eighty", 1), "spec.ports"},
		{"ServiceMonitor", sm, ""},
		{"ServiceMonitor unknown field", strings.Replace(sm, "port: http", "port: http, intervl: 5s", 1), `unknown field "spec.endpoints[0].intervl"`},
		{"WasmPlugin", wp, ""},
		{"WasmPlugin unknown spec field", strings.Replace(wp, "url:", "urll: a\n  url:", 1), `unknown field "urll"`},
		{"WasmPlugin unknown metadata field", strings.Replace(wp, "{name: w}", "{name: w, nam: x}", 1), `unknown field "metadata.nam"`},
		{"EnvoyExtensionPolicy", eep, ""},
		{"EnvoyExtensionPolicy unknown field", strings.Replace(eep, "kind: HTTPRoute", "knd: HTTPRoute, kind: HTTPRoute", 1), `unknown field "spec.targetRefs[0].knd"`},
		{"unknown kind", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", "unknown kind"},
		{"no name", "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "metadata.name is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.doc))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("valid document refused: %v", err)
			case tt.want != "" && err == nil:
				t.Fatalf("accepted:\n%s", tt.doc)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// TestSplit: empty documents (a template that rendered nothing) are dropped.
func TestSplit(t *testing.T) {
	docs, err := Split([]byte("---\n# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("%d documents, want 2", len(docs))
	}
}
