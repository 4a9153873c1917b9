package gateway

import (
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// M is a piece of Envoy configuration.
type M = stack.M

// listenerName is the listener, and so the rate limit domain, of Envoy
// Gateway's Gateway default/eg, listener http.
const listenerName = "default/eg/http"

// sharedDomain is the domain of the shared rule of BackendTrafficPolicy
// default/shared: "<ns>/<policy>".
const sharedDomain = "default/shared"

// sharedRule is that rule's name, the key and value of its top descriptor.
const sharedRule = "default/shared/rule/0"

// filterName is the listener's rate limit filter, and sharedFilter the one
// Envoy Gateway adds for the shared rule's domain.
const (
	filterName   = "envoy.filters.http.ratelimit"
	sharedFilter = "envoy.filters.http.ratelimit/" + sharedDomain
)

// routeName is Envoy Gateway's name of an HTTPRoute's first rule and match.
func routeName(route string) string { return "httproute/default/" + route + "/rule/0/match/0/*" }

// fixture is one route: its path prefix, its BackendTrafficPolicy rule
// (as Envoy Gateway's IR holds it) and the Envoy rate limit actions Envoy
// Gateway generates for it.
type fixture struct {
	route   string
	prefix  string
	rule    xdstest.Rule
	actions []M // after the route's generic_key
	cost    uint64
	shared  bool
}

const hour = rlsconfv3.RateLimitUnit_HOUR

func genericKey(k string) M {
	return M{"generic_key": M{"descriptor_key": k, "descriptor_value": k}}
}

func headerMatch(key, header string, match M) M {
	return M{"header_value_match": M{"descriptor_key": key, "descriptor_value": key, "expect_match": true,
		"headers": []M{{"name": header, "string_match": match}}}}
}

// fixtures are the scenarios' routes.
var fixtures = []fixture{
	{route: "header", prefix: "/header", rule: xdstest.Rule{Headers: []bool{false}, Requests: 3, Unit: hour},
		actions: []M{headerMatch("rule-0-match-0", "x-user-id", M{"exact": "one"})}},
	{route: "distinct", prefix: "/distinct", rule: xdstest.Rule{Headers: []bool{true}, Requests: 2, Unit: hour},
		actions: []M{{"request_headers": M{"header_name": "x-user-id", "descriptor_key": "rule-0-match-0"}}}},
	{route: "cidr", prefix: "/cidr", rule: xdstest.Rule{CIDR: "127.0.0.0/8", CIDRDistinct: true, Requests: 2, Unit: hour},
		actions: []M{{"masked_remote_address": M{"v4_prefix_mask_len": 8}}, {"remote_address": M{}}}},
	{route: "method-path", prefix: "/method-path", rule: xdstest.Rule{Method: true, Path: true, Requests: 2, Unit: hour},
		actions: []M{headerMatch("rule-0-method", ":method", M{"exact": "GET"}), headerMatch("rule-0-path", ":path", M{"prefix": "/method-path/x"})}},
	{route: "all", prefix: "/all", rule: xdstest.Rule{Requests: 3, Unit: hour}, actions: []M{genericKey("rule-0-match--1")}},
	{route: "shared-a", prefix: "/shared-a", shared: true},
	{route: "shared-b", prefix: "/shared-b", shared: true},
	{route: "shadow", prefix: "/shadow", rule: xdstest.Rule{Requests: 1, Unit: hour, Shadow: true}, actions: []M{genericKey("rule-0-match--1")}},
	{route: "cost", prefix: "/cost", rule: xdstest.Rule{Requests: 21, Unit: hour}, actions: []M{genericKey("rule-0-match--1")}, cost: 10},
	// Routes whose limits only later snapshots hold.
	{route: "late", prefix: "/late", rule: xdstest.Rule{Requests: 1, Unit: hour}, actions: []M{genericKey("rule-0-match--1")}},
	{route: "late2", prefix: "/late2", rule: xdstest.Rule{Requests: 1, Unit: hour}, actions: []M{genericKey("rule-0-match--1")}},
}

// sharedLimit is the shared rule's limit.
var sharedLimit = xdstest.Rule{Requests: 3, Unit: hour}

// snapshot returns the resources Envoy Gateway would serve with the
// fixtures' policies, the routes named in extra included (the others of
// late, late2 left out), and the listener's routes' limits overridden by
// over (route -> requests).
func snapshot(extra []string, over map[string]uint32) []*rlsconfv3.RateLimitConfig {
	var tops []*rlsconfv3.RateLimitDescriptor
	for _, f := range fixtures {
		if f.shared || ((f.route == "late" || f.route == "late2") && !contains(extra, f.route)) {
			continue
		}
		r := f.rule
		if n, ok := over[f.route]; ok {
			r.Requests = n
		}
		tops = append(tops, xdstest.RouteDescriptor(routeName(f.route), r))
	}
	return []*rlsconfv3.RateLimitConfig{
		xdstest.Config(listenerName, tops...),
		xdstest.Config(sharedDomain, xdstest.RouteDescriptor(sharedRule, sharedLimit)),
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// route is the Envoy route Envoy Gateway generates for f: the upstream, and
// per filter a RateLimitPerRoute with the domain and the rate limits.
func (f fixture) envoyRoute() M {
	perRoute := func(domain string, rl M) M {
		return M{"@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
			"domain": domain, "rate_limits": []M{rl}}
	}
	r := stack.RouteTo(f.prefix, "upstream")
	r["name"] = routeName(f.route)
	if f.shared {
		rl := M{"actions": []M{genericKey(sharedRule), genericKey("rule-0-match--1")}}
		r["typed_per_filter_config"] = M{sharedFilter: perRoute(sharedDomain, rl)}
		return r
	}
	rl := M{"actions": append([]M{genericKey(routeName(f.route))}, f.actions...)}
	if f.cost > 0 {
		rl["hits_addend"] = M{"number": f.cost}
	}
	r["typed_per_filter_config"] = M{filterName: perRoute(listenerName, rl)}
	return r
}

// rateLimitFilter is the listener's filter for domain, as Envoy Gateway
// writes it.
func rateLimitFilter(name, domain string) M {
	return M{"name": name, "typed_config": M{
		"@type":                              "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
		"domain":                             domain,
		"disable_x_envoy_ratelimited_header": true,
		"enable_x_ratelimit_headers":         "DRAFT_VERSION_03",
		"timeout":                            "2s",
		"rate_limit_service": M{"transport_api_version": "V3",
			"grpc_service": M{"envoy_grpc": M{"cluster_name": "ratelimit_cluster"}, "timeout": "2s"}},
	}}
}

// bootstrap is Envoy's configuration: the listener, the upstream, and
// ratelimit_cluster over mutual TLS with Envoy's client certificate.
func bootstrap(upstream, ratelimit string, pki *pkiFiles) M {
	var routes []M
	// Longer prefixes first: /late2 before /late.
	for i := len(fixtures) - 1; i >= 0; i-- {
		routes = append(routes, fixtures[i].envoyRoute())
	}
	l := stack.HTTPListener(listenerName, 0, []M{stack.VirtualHost("eg", routes...)},
		rateLimitFilter(filterName, listenerName), rateLimitFilter(sharedFilter, sharedDomain))
	rl := stack.GRPCCluster("ratelimit_cluster", ratelimit)
	rl["transport_socket"] = M{"name": "envoy.transport_sockets.tls", "typed_config": M{
		"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
		"common_tls_context": M{
			"tls_params":         M{"tls_maximum_protocol_version": "TLSv1_3"},
			"tls_certificates":   []M{{"certificate_chain": M{"filename": pki.envoyCert}, "private_key": M{"filename": pki.envoyKey}}},
			"validation_context": M{"trusted_ca": M{"filename": pki.ca}},
		},
	}}
	return stack.Bootstrap([]M{l}, []M{stack.Cluster("upstream", upstream), rl})
}

// pkiFiles are the certificates, as Envoy Gateway's: one CA; the rate limit
// service's certificate (its gRPC server and its xDS client); Envoy's client
// certificate.
type pkiFiles struct {
	ca                  string
	rlCert, rlKey       string
	envoyCert, envoyKey string
}
