package xdstest

import (
	"strconv"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// Rule is one BackendTrafficPolicy rateLimit.global rule, as Envoy
// Gateway's IR holds it.
type Rule struct {
	// Headers are the header matches, in order; true marks a Distinct one
	// (a counter per value).
	Headers []bool
	// Method and Path say whether the rule matches methods or a path.
	Method, Path bool
	// CIDR is the clientSelectors' sourceCIDR ("" for none); CIDRDistinct
	// counts each client address apart.
	CIDR         string
	CIDRDistinct bool
	// Shadow is shadowMode.
	Shadow bool
	// Requests and Unit are the limit.
	Requests uint32
	Unit     rlsconfv3.RateLimitUnit
}

// matchSet reports whether the rule matches anything (else it applies to
// all traffic of the route).
func (r Rule) matchSet() bool { return len(r.Headers) > 0 || r.Method || r.Path || r.CIDR != "" }

// RuleKey is Envoy Gateway's descriptor key of rule i's match j
// ("rule-0-match-1"; j = -1 for a rule without matches).
func RuleKey(i, j int) string { return "rule-" + strconv.Itoa(i) + "-match-" + strconv.Itoa(j) }

// RouteDescriptor returns the top descriptor Envoy Gateway writes for a
// route (or, for a shared rule, for the policy's rule name): key and value
// the route name, one nested chain per rule, the limit at its end.
func RouteDescriptor(route string, rules ...Rule) *rlsconfv3.RateLimitDescriptor {
	top := &rlsconfv3.RateLimitDescriptor{Key: route, Value: route}
	for i, r := range rules {
		top.Descriptors = append(top.Descriptors, ruleChain(i, r))
	}
	return top
}

// ruleChain is one rule's nested descriptors.
func ruleChain(i int, r Rule) *rlsconfv3.RateLimitDescriptor {
	var head, cur *rlsconfv3.RateLimitDescriptor
	add := func(key, value string) {
		d := &rlsconfv3.RateLimitDescriptor{Key: key, Value: value, ShadowMode: r.Shadow}
		if cur == nil {
			head = d
		} else {
			cur.Descriptors = []*rlsconfv3.RateLimitDescriptor{d}
		}
		cur = d
	}
	for j, distinct := range r.Headers {
		if distinct {
			add(RuleKey(i, j), "")
		} else {
			add(RuleKey(i, j), RuleKey(i, j))
		}
	}
	if r.Method {
		add("rule-"+strconv.Itoa(i)+"-method", "rule-"+strconv.Itoa(i)+"-method")
	}
	if r.Path {
		add("rule-"+strconv.Itoa(i)+"-path", "rule-"+strconv.Itoa(i)+"-path")
	}
	if r.CIDR != "" {
		add("masked_remote_address", r.CIDR)
		if r.CIDRDistinct {
			add("remote_address", "")
		}
	}
	if !r.matchSet() {
		add(RuleKey(i, -1), RuleKey(i, -1))
	}
	cur.RateLimit = &rlsconfv3.RateLimitPolicy{RequestsPerUnit: r.Requests, Unit: r.Unit}
	return head
}

// Config is one RateLimitConfig: name = domain, as Envoy Gateway writes
// them (the listener name, or "<ns>/<policy>" for shared rules).
func Config(domain string, descriptors ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: descriptors}
}
