package docs

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/filter/core/config"
)

// pages returns README.md and every page of docs/, relative to this
// directory.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"../README.md"}
	more, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(more)
	return append(out, more...)
}

// block is one fenced code block of a page.
type block struct {
	page, lang, text string
	line             int
}

var fence = regexp.MustCompile("^```([A-Za-z0-9_-]*)\\s*(.*)$")

// blocks returns the fenced code blocks of page.
func blocks(t *testing.T, page string) []block {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	var cur *block
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil:
			if m := fence.FindStringSubmatch(l); m != nil {
				cur = &block{page: page, lang: m[1], line: i + 1}
			}
		case strings.HasPrefix(l, "```"):
			out = append(out, *cur)
			cur = nil
		default:
			cur.text += l + "\n"
		}
	}
	if cur != nil {
		t.Errorf("%s:%d: a code block is not closed", page, cur.line)
	}
	return out
}

// TestExamples: every YAML and JSON example in README.md and docs/ is read
// by what reads it in production: policies by the policy parser, the
// plugin configuration by the filter's parser, Envoy configuration by
// `envoy --mode validate`. Kubernetes objects are the deploy module's to
// check. Any other YAML or JSON fails: say what it is here.
func TestExamples(t *testing.T) {
	var envoyBlocks []block
	n := 0
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			where := b.page + ":" + itoa(b.line)
			switch b.lang {
			case "json":
				n++
				if _, err := config.Parse([]byte(b.text)); err != nil {
					t.Errorf("%s: the plugin configuration does not parse: %v", where, err)
				}
			case "yaml", "yml":
				n++
				var top map[string]any
				if err := yaml.Unmarshal([]byte(b.text), &top); err != nil {
					t.Errorf("%s: invalid YAML: %v", where, err)
					continue
				}
				switch {
				case top["domain"] != nil && top["descriptors"] != nil:
					if _, err := policy.Parse(where, []byte(b.text)); err != nil {
						t.Errorf("%s: the policy does not parse: %v", where, err)
					}
				case top["apiVersion"] != nil && top["kind"] != nil:
					// a Kubernetes object: deploy/'s tests decode them strictly
				case top["http_filters"] != nil || top["static_resources"] != nil || top["clusters"] != nil:
					envoyBlocks = append(envoyBlocks, b)
				default:
					t.Errorf("%s: a YAML example that is neither a policy, Envoy configuration nor a Kubernetes object: teach TestExamples to check it", where)
				}
			}
		}
	}
	if n < 5 {
		t.Fatalf("only %d examples found: the test no longer sees them", n)
	}
	if testing.Short() {
		t.Skip("runs Envoy")
	}
	for _, b := range envoyBlocks {
		t.Run(filepath.Base(b.page)+":"+itoa(b.line), func(t *testing.T) {
			t.Parallel()
			validateEnvoy(t, b)
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

var clusterRef = regexp.MustCompile(`cluster(?:_name)?:\s*"?([A-Za-z0-9_.-]+)`)

var (
	wasmOnce sync.Once
	wasmPath string
	wasmErr  error
)

// builtWasm builds filter.wasm once for the examples that load it.
func builtWasm(t *testing.T) string {
	wasmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-docs-wasm-")
		if err != nil {
			wasmErr = err
			return
		}
		wasmPath = filepath.Join(dir, "filter.wasm")
		wasmErr = stack.BuildWasm(context.Background(), wasmPath)
	})
	if wasmErr != nil {
		t.Fatal(wasmErr)
	}
	return wasmPath
}

var (
	nativeOnce sync.Once
	nativePath string
	nativeErr  error
)

// builtNative builds libsluice.so once for the examples that load it.
func builtNative(t *testing.T) string {
	nativeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-docs-native-")
		if err != nil {
			nativeErr = err
			return
		}
		nativePath = filepath.Join(dir, "libsluice.so")
		nativeErr = stack.BuildNative(context.Background(), nativePath)
	})
	if nativeErr != nil {
		t.Fatal(nativeErr)
	}
	return nativePath
}

// nativeByName is a dynamic_module_config line loading libsluice.so by
// name, which an example's Envoy would find in its search path.
var nativeByName = regexp.MustCompile(`(?m)^(\s*)name: sluice\b.*$`)

// validateEnvoy runs `envoy --mode validate` on an example: a whole
// bootstrap as it is, or a list of http_filters inside a listener of a
// bootstrap that defines the clusters the example names (HTTP/2, on a port
// nobody serves: validate mode does not connect).
func validateEnvoy(t *testing.T, b block) {
	text := b.text
	if strings.Contains(text, "filter.wasm") {
		text = regexp.MustCompile(`filename:\s*\S*filter\.wasm`).ReplaceAllString(text, "filename: "+builtWasm(t))
	}
	if strings.Contains(text, "envoy.filters.http.dynamic_modules") {
		// Loaded from the file built from this repository: validate mode
		// loads the module and runs its check of the plugin configuration.
		text = nativeByName.ReplaceAllString(text, "${1}module: {local: {filename: "+builtNative(t)+"}}")
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["static_resources"] == nil {
		var filters []stack.M
		if hf, ok := doc["http_filters"].([]any); ok {
			for _, f := range hf {
				m, _ := f.(map[string]any)
				filters = append(filters, stack.M(m))
			}
		}
		var listeners []stack.M
		if len(filters) > 0 {
			route := []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "upstream"))}
			listeners = append(listeners, stack.HTTPListener("example", 0, route, filters...))
		}
		clusters := []stack.M{stack.Cluster("upstream", "127.0.0.1:1")}
		seen := map[string]bool{"upstream": true}
		if cs, ok := doc["clusters"].([]any); ok {
			for _, c := range cs {
				m, _ := c.(map[string]any)
				clusters = append(clusters, stack.M(m))
				if name, _ := m["name"].(string); name != "" {
					seen[name] = true
				}
			}
		}
		for _, m := range clusterRef.FindAllStringSubmatch(text, -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				clusters = append(clusters, stack.GRPCCluster(m[1], "127.0.0.1:1"))
			}
		}
		doc = map[string]any(stack.Bootstrap(listeners, clusters))
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := stack.ValidateEnvoy(context.Background(), "", path); err != nil {
		t.Errorf("%s:%d: envoy --mode validate refuses the example: %v\n%s", b.page, b.line, err, msg)
	}
}

// TestPluginFieldsDocumented: every field the filter's configuration
// accepts has a row in filter.md, and every row is a field.
func TestPluginFieldsDocumented(t *testing.T) {
	b, err := os.ReadFile("filter.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_0-9.\\[\\]]+)` \\|").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = true
	}
	fields := map[string]bool{}
	for _, f := range config.Fields() {
		fields[f] = true
		if !rows[f] {
			t.Errorf("filter.md has no row | `%s` | type | default | meaning |", f)
		}
	}
	start := strings.Index(string(b), "## Fields")
	end := strings.Index(string(b)[start+1:], "\n## ")
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_0-9.\\[\\]]+)` \\|").FindAllStringSubmatch(string(b)[start:start+1+end], -1) {
		if !fields[m[1]] {
			t.Errorf("filter.md documents %s, which the configuration does not accept", m[1])
		}
	}
}
