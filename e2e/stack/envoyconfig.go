package stack

import (
	"maps"
	"net"
	"strconv"
	"time"
)

// M is a piece of Envoy configuration: JSON-shaped, as Envoy's v3 API reads
// it. The builders below return the common pieces; a test changes any field
// it needs before StartEnvoy writes the bootstrap as JSON.
type M = map[string]any

// Bootstrap returns a static bootstrap with these listeners and clusters.
func Bootstrap(listeners []M, clusters []M) M {
	return M{
		"node": M{"id": "sluice-test", "cluster": "sluice-test"},
		"static_resources": M{
			"listeners": listeners,
			"clusters":  clusters,
		},
	}
}

// SocketAddress returns an Envoy address.
func SocketAddress(host string, port int) M {
	return M{"socket_address": M{"address": host, "port_value": port}}
}

// HTTPListener returns a listener named name on 127.0.0.1:port (0: a port
// the kernel picks) with an HTTP connection manager that runs filters, then
// the router, on the virtual hosts given.
func HTTPListener(name string, port int, virtualHosts []M, filters ...M) M {
	hf := append(append([]M(nil), filters...), M{
		"name":         "envoy.filters.http.router",
		"typed_config": M{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
	})
	return M{
		"name":    name,
		"address": SocketAddress("127.0.0.1", port),
		"filter_chains": []M{{
			"filters": []M{{
				"name": "envoy.filters.network.http_connection_manager",
				"typed_config": M{
					"@type":              "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
					"stat_prefix":        name,
					"codec_type":         "AUTO",
					"use_remote_address": true,
					"route_config":       M{"name": name, "virtual_hosts": virtualHosts},
					"http_filters":       hf,
				},
			}},
		}},
	}
}

// VirtualHost returns a virtual host for every domain with these routes.
func VirtualHost(name string, routes ...M) M {
	return M{"name": name, "domains": []string{"*"}, "routes": routes}
}

// RouteTo returns a route of every path under prefix to cluster.
func RouteTo(prefix, cluster string) M {
	return M{"match": M{"prefix": prefix}, "route": M{"cluster": cluster, "timeout": "15s"}}
}

// DirectResponse returns a route under prefix that Envoy answers itself with
// status and body (no upstream, and no route entry: Envoy's ratelimit filter
// does not run on it).
func DirectResponse(prefix string, status int, body string) M {
	return M{"match": M{"prefix": prefix}, "direct_response": M{"status": status, "body": M{"inline_string": body}}}
}

// WasmFilter returns the envoy.filters.http.wasm filter running filter.wasm
// (path) under V8 with the plugin configuration plugin (JSON).
func WasmFilter(path string, plugin []byte) M {
	return M{
		"name": "envoy.filters.http.wasm",
		"typed_config": M{
			"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
			"config": M{
				"name":    "sluice",
				"root_id": "sluice",
				"vm_config": M{
					"vm_id":   "sluice",
					"runtime": "envoy.wasm.runtime.v8",
					"code":    M{"local": M{"filename": path}},
				},
				"configuration": M{
					"@type": "type.googleapis.com/google.protobuf.StringValue",
					"value": string(plugin),
				},
			},
		},
	}
}

// RateLimitFilter returns Envoy's own envoy.filters.http.ratelimit calling
// the rate limit service at cluster (Envoy's gRPC client) for domain; extra
// fields (failure_mode_deny, enable_x_ratelimit_headers, ...) are merged in.
func RateLimitFilter(domain, cluster string, extra M) M {
	tc := M{
		"@type":  "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
		"domain": domain,
		// The filter bounds each call with its own timeout (20 ms by
		// default), whatever the grpc_service's says.
		"timeout": "1s",
		"rate_limit_service": M{
			"transport_api_version": "V3",
			"grpc_service":          M{"envoy_grpc": M{"cluster_name": cluster}, "timeout": "1s"},
		},
	}
	maps.Copy(tc, extra)
	return M{"name": "envoy.filters.http.ratelimit", "typed_config": tc}
}

// ResponseCost gives route the rate limits Envoy Gateway generates for a
// response cost (an LLM's tokens), for Envoy's ratelimit filter: actions
// at request time with hits_addend 0, and the same actions again with
// apply_on_stream_done and hits_addend from the dynamic metadata
// io.envoy.ai_gateway:llm_total_token. It returns the Lua filter, to put
// before the ratelimit filter, that sets that metadata from the upstream's
// response header.
func ResponseCost(route M, actions []M, header string) (lua M) {
	route["typed_per_filter_config"] = M{"envoy.filters.http.ratelimit": M{
		"@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
		"rate_limits": []M{
			{"actions": actions, "hits_addend": M{"number": 0}},
			{"actions": actions, "apply_on_stream_done": true,
				"hits_addend": M{"format": "%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_total_token)%"}},
		},
	}}
	return M{
		"name": "envoy.filters.http.lua",
		"typed_config": M{
			"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
			"default_source_code": M{"inline_string": `
function envoy_on_response(h)
  local n = h:headers():get("` + header + `")
  if n and n ~= "" then
    h:streamInfo():dynamicMetadata():set("io.envoy.ai_gateway", "llm_total_token", tonumber(n))
  end
end`},
		},
	}
}

// Cluster returns a static cluster of one endpoint, addr (host:port).
func Cluster(name, addr string) M {
	host, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	return M{
		"name":            name,
		"type":            "STATIC",
		"connect_timeout": "1s",
		"lb_policy":       "ROUND_ROBIN",
		"load_assignment": M{
			"cluster_name": name,
			"endpoints":    []M{{"lb_endpoints": []M{{"endpoint": M{"address": SocketAddress(host, port)}}}}},
		},
	}
}

// GRPCCluster returns Cluster speaking HTTP/2 without TLS (h2c) to its
// endpoint, as a gRPC service needs.
func GRPCCluster(name, addr string) M {
	c := Cluster(name, addr)
	c["connect_timeout"] = "0.25s"
	c["typed_extension_protocol_options"] = M{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": M{
			"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
			"explicit_http_config": M{"http2_protocol_options": M{}},
		},
	}
	return c
}

// Duration formats d the way Envoy's JSON reads a google.protobuf.Duration.
func Duration(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// cloneM copies m deeply enough that setting a top-level key of the copy
// leaves m unchanged.
func cloneM(m M) M { return maps.Clone(m) }
