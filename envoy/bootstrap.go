package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	// Register every type envoy.yaml names in an "@type", so that protojson can resolve them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
)

// WasmFilterName is the name of Envoy's HTTP Wasm filter.
const WasmFilterName = "envoy.filters.http.wasm"

// WasmPlugin is one envoy.filters.http.wasm filter found in a bootstrap.
type WasmPlugin struct {
	Path          string                      // where the filter is, as a field path in the bootstrap
	Config        *wasmfilterv3.Wasm          // the filter's typed configuration
	Configuration string                      // the plugin configuration passed to proxy_on_configure
	Listener      string                      // name of the listener the filter is in
	Routes        *routev3.RouteConfiguration // the inline route configuration of that listener, if any
}

// Load parses an Envoy v3 bootstrap written in YAML and checks it the way Envoy does when it reads
// one: unknown fields, wrong types, bad enum values and unresolvable "@type" URLs, the
// protoc-gen-validate rules of the bootstrap and of every typed_config inside it, protocol options
// filed under the wrong name, and clusters that routes or sluice plugin configurations name but that
// are not defined. name is the file name used in error messages.
func Load(name string, text []byte) (*bootstrapv3.Bootstrap, error) {
	js, lines, err := yamlToJSON(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("%s: %s", name, yamlPositions(err.Error(), lines))
	}
	if err := validateTree(b.ProtoReflect(), ""); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := checkReferences(b); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// WasmPlugins returns the envoy.filters.http.wasm filters of b's static listeners, with their plugin
// configuration as the string proxy_on_configure receives. It fails on a plugin configuration that
// is not a google.protobuf.StringValue.
func WasmPlugins(b *bootstrapv3.Bootstrap) ([]WasmPlugin, error) {
	var out []WasmPlugin
	for i, l := range b.GetStaticResources().GetListeners() {
		for j, fc := range l.GetFilterChains() {
			for k, f := range fc.GetFilters() {
				path := fmt.Sprintf("static_resources.listeners[%d].filter_chains[%d].filters[%d]", i, j, k)
				hcm := &hcmv3.HttpConnectionManager{}
				if !isType(f.GetTypedConfig(), hcm) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					return nil, fmt.Errorf("%s.typed_config: %v", path, err)
				}
				for n, hf := range hcm.GetHttpFilters() {
					w := &wasmfilterv3.Wasm{}
					if !isType(hf.GetTypedConfig(), w) {
						continue
					}
					fpath := fmt.Sprintf("%s.typed_config.http_filters[%d]", path, n)
					if err := hf.GetTypedConfig().UnmarshalTo(w); err != nil {
						return nil, fmt.Errorf("%s.typed_config: %v", fpath, err)
					}
					p := WasmPlugin{Path: fpath, Config: w, Listener: l.GetName(), Routes: hcm.GetRouteConfig()}
					if c := w.GetConfig().GetConfiguration(); c != nil {
						conf, err := pluginConfiguration(c)
						if err != nil {
							return nil, fmt.Errorf("%s.typed_config.config.configuration: %v", fpath, err)
						}
						p.Configuration = conf
					}
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
}

// pluginConfiguration returns what Envoy passes to proxy_on_configure for a plugin configuration:
// the content of a StringValue or BytesValue, or a Struct as JSON. Envoy accepts no other type.
func pluginConfiguration(a *anypb.Any) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", err
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return v.GetValue(), nil
	case *wrapperspb.BytesValue:
		return string(v.GetValue()), nil
	case *structpb.Struct:
		b, err := protojson.Marshal(v)
		return string(b), err
	}
	return "", fmt.Errorf("is a %s; Envoy passes only google.protobuf.StringValue, BytesValue or Struct to the plugin", a.MessageName())
}

// isType reports whether a holds a message of m's type.
func isType(a *anypb.Any, m proto.Message) bool {
	return a != nil && a.MessageName() == m.ProtoReflect().Descriptor().FullName()
}

// validator is implemented by every message that protoc-gen-validate generated code for.
type validator interface{ ValidateAll() error }

// validateTree runs the protoc-gen-validate rules on m, then on the content of every
// google.protobuf.Any below it (which those rules do not enter), recursively. path is m's field
// path, used in errors.
func validateTree(m protoreflect.Message, path string) error {
	if v, ok := m.Interface().(validator); ok {
		if err := v.ValidateAll(); err != nil {
			where := path
			if where == "" {
				where = string(m.Descriptor().FullName())
			} else {
				where = fmt.Sprintf("%s (%s)", path, m.Descriptor().FullName())
			}
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return walkAnys(m, path, func(a *anypb.Any, at string) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %v", at, err)
		}
		return validateTree(inner.ProtoReflect(), at)
	})
}

// walkAnys calls visit for each google.protobuf.Any directly or indirectly below m without entering
// the Anys themselves. path is m's field path; visit gets the Any's.
func walkAnys(m protoreflect.Message, path string, visit func(a *anypb.Any, path string) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		at := string(fd.Name())
		if path != "" {
			at = path + "." + at
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = walkMessage(l.Get(i).Message(), fmt.Sprintf("%s[%d]", at, i), visit)
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = walkMessage(mv.Message(), fmt.Sprintf("%s[%q]", at, k.String()), visit)
				return err == nil
			})
		default:
			err = walkMessage(v.Message(), at, visit)
		}
		return err == nil
	})
	return err
}

// walkMessage visits m if it is an Any and walks into it otherwise.
func walkMessage(m protoreflect.Message, path string, visit func(a *anypb.Any, path string) error) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		return visit(a, path)
	}
	return walkAnys(m, path, visit)
}

// protocolOptionsKeys lists, for the protocol options types this package knows, the keys Envoy
// accepts for them in a cluster's typed_extension_protocol_options: the documented key first, then
// the extension's qualified name.
var protocolOptionsKeys = map[protoreflect.FullName][]string{
	"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
		"envoy.upstreams.http.http_protocol_options",
	},
}

// checkReferences checks what Envoy checks across resources at start-up: cluster names are unique,
// known typed_extension_protocol_options are filed under a key Envoy accepts, every cluster a static route
// sends to is defined (Envoy's validate_clusters), and so is the cluster each sluice plugin
// configuration calls.
func checkReferences(b *bootstrapv3.Bootstrap) error {
	clusters := map[string]bool{}
	for i, c := range b.GetStaticResources().GetClusters() {
		path := fmt.Sprintf("static_resources.clusters[%d]", i)
		if clusters[c.GetName()] {
			return fmt.Errorf("%s.name: cluster %q is defined twice", path, c.GetName())
		}
		clusters[c.GetName()] = true
		for key, a := range c.GetTypedExtensionProtocolOptions() {
			keys, known := protocolOptionsKeys[a.MessageName()]
			if known && !slices.Contains(keys, key) {
				return fmt.Errorf("%s.typed_extension_protocol_options[%q]: holds %s; Envoy looks protocol options up by their key, which must be %q",
					path, key, a.MessageName(), keys[0])
			}
		}
	}
	plugins, err := WasmPlugins(b)
	if err != nil {
		return err
	}
	// Routes: every inline route configuration of every HTTP connection manager.
	for i, l := range b.GetStaticResources().GetListeners() {
		for j, fc := range l.GetFilterChains() {
			for k, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if !isType(f.GetTypedConfig(), hcm) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					return err
				}
				path := fmt.Sprintf("static_resources.listeners[%d].filter_chains[%d].filters[%d].typed_config.route_config", i, j, k)
				if err := checkRoutes(hcm.GetRouteConfig(), path, clusters); err != nil {
					return err
				}
			}
		}
	}
	for _, p := range plugins {
		if p.Configuration == "" {
			continue
		}
		var conf struct {
			Cluster *string `json:"cluster"`
		}
		if err := json.Unmarshal([]byte(p.Configuration), &conf); err != nil {
			return fmt.Errorf("%s.typed_config.config.configuration: plugin configuration is not valid JSON: %v", p.Path, err)
		}
		if conf.Cluster != nil && !clusters[*conf.Cluster] {
			return fmt.Errorf("%s.typed_config.config.configuration: plugin configuration field cluster names %q, which is not a cluster in static_resources.clusters",
				p.Path, *conf.Cluster)
		}
	}
	return nil
}

// checkRoutes checks that every cluster rc's routes send to is in clusters.
func checkRoutes(rc *routev3.RouteConfiguration, path string, clusters map[string]bool) error {
	for i, vh := range rc.GetVirtualHosts() {
		for j, r := range vh.GetRoutes() {
			at := fmt.Sprintf("%s.virtual_hosts[%d].routes[%d].route", path, i, j)
			if c := r.GetRoute().GetCluster(); c != "" && !clusters[c] {
				return fmt.Errorf("%s.cluster: %q is not a cluster in static_resources.clusters", at, c)
			}
			for n, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
				if c := wc.GetName(); c != "" && !clusters[c] {
					return fmt.Errorf("%s.weighted_clusters.clusters[%d].name: %q is not a cluster in static_resources.clusters", at, n, c)
				}
			}
		}
	}
	return nil
}

// jsonPos matches the position protojson puts in its errors.
var jsonPos = regexp.MustCompile(`\(line (\d+):\d+\)`)

// yamlPositions rewrites the JSON line numbers in a protojson error message into the YAML lines
// they came from; lines[i] is the YAML line of JSON line i+1.
func yamlPositions(msg string, lines []int) string {
	return jsonPos.ReplaceAllStringFunc(msg, func(s string) string {
		n, err := strconv.Atoi(jsonPos.FindStringSubmatch(s)[1])
		if err != nil || n < 1 || n > len(lines) {
			return s
		}
		return fmt.Sprintf("(line %d)", lines[n-1])
	})
}

// yamlToJSON converts a YAML document to JSON with one value per line, and returns for each JSON
// line the YAML line it came from. Anchors, aliases and merge keys ("<<") are resolved.
func yamlToJSON(text []byte) ([]byte, []int, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil, errors.New("empty YAML document")
	}
	w := &jsonWriter{lines: []int{doc.Content[0].Line}}
	if err := w.value(doc.Content[0], "", 0); err != nil {
		return nil, nil, err
	}
	return w.buf.Bytes(), w.lines, nil
}

// jsonWriter accumulates JSON text and the YAML line of each JSON line.
type jsonWriter struct {
	buf   bytes.Buffer // the JSON so far
	lines []int        // lines[i] is the YAML line JSON line i+1 came from
}

// maxDepth bounds the nesting of the YAML input (and of aliases that refer to their own parents).
const maxDepth = 200

// newline starts a new JSON line that came from YAML line yamlLine.
func (w *jsonWriter) newline(yamlLine int) {
	w.buf.WriteByte('\n')
	w.lines = append(w.lines, yamlLine)
}

// value writes n as JSON; path names n in errors.
func (w *jsonWriter) value(n *yaml.Node, path string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("line %d: %s: nested more than %d levels deep", n.Line, path, maxDepth)
	}
	switch n.Kind {
	case yaml.AliasNode:
		return w.value(n.Alias, path, depth+1)
	case yaml.MappingNode:
		pairs, err := mappingPairs(n, path, depth)
		if err != nil {
			return err
		}
		w.buf.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.newline(p.key.Line)
			k, _ := json.Marshal(p.key.Value)
			w.buf.Write(k)
			w.buf.WriteByte(':')
			if err := w.value(p.val, joinPath(path, p.key.Value), depth+1); err != nil {
				return err
			}
		}
		w.newline(n.Line)
		w.buf.WriteByte('}')
	case yaml.SequenceNode:
		w.buf.WriteByte('[')
		for i, e := range n.Content {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.newline(e.Line)
			if err := w.value(e, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		w.newline(n.Line)
		w.buf.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %s: %v", n.Line, path, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %s: value %q has no JSON form: %v", n.Line, path, n.Value, err)
		}
		w.buf.Write(b)
	default:
		return fmt.Errorf("line %d: %s: unexpected YAML node", n.Line, path)
	}
	return nil
}

// pair is one key and value of a YAML mapping.
type pair struct{ key, val *yaml.Node }

// mappingPairs returns n's keys and values in order with merge keys resolved: a merged mapping's
// entries come after n's own and never override them. Keys must be strings and unique.
func mappingPairs(n *yaml.Node, path string, depth int) ([]pair, error) {
	var own, merged []pair
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			srcs := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				srcs = v.Content
			}
			for _, src := range srcs {
				for src.Kind == yaml.AliasNode {
					src = src.Alias
				}
				if src.Kind != yaml.MappingNode {
					return nil, fmt.Errorf("line %d: %s: << must merge a mapping", k.Line, path)
				}
				if depth > maxDepth {
					return nil, fmt.Errorf("line %d: %s: nested more than %d levels deep", k.Line, path, maxDepth)
				}
				ps, err := mappingPairs(src, path, depth+1)
				if err != nil {
					return nil, err
				}
				merged = append(merged, ps...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return nil, fmt.Errorf("line %d: %s: key %q is not a string", k.Line, path, k.Value)
		}
		if seen[k.Value] {
			return nil, fmt.Errorf("line %d: %s: key %q appears twice", k.Line, joinPath(path, k.Value), k.Value)
		}
		seen[k.Value] = true
		own = append(own, pair{k, v})
	}
	for _, p := range merged {
		if !seen[p.key.Value] {
			seen[p.key.Value] = true
			own = append(own, p)
		}
	}
	return own, nil
}

// joinPath appends a field name to a dotted path.
func joinPath(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + strings.ReplaceAll(field, ".", `\.`)
}
