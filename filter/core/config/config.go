// Package config reads and validates the filter's plugin configuration.
//
// The configuration is the JSON document Envoy hands the plugin (the
// plugin_config's configuration, usually a google.protobuf.StringValue).
// Example:
//
//	{
//	  "cluster": "sluice_control_plane",
//	  "authority": "sluice-control-plane",
//	  "domain": "edge",
//	  "timeout": "20ms",
//	  "failure_mode": "open",
//	  "status_on_error": 500,
//	  "rate_limits": [
//	    {"actions": [{"remote_address": {}}]},
//	    {"actions": [
//	      {"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}},
//	      {"path": {}}
//	    ], "hits_addend": 1},
//	    {"actions": [{"generic_key": {"descriptor_value": "all"}}]}
//	  ],
//	  "precheck": {"enabled": true, "max_entries": 10000},
//	  "headers": {"draft10": true, "legacy": false, "retry_after": true, "failure_mode": false, "delayed": false},
//	  "max_held": 1000,
//	  "shared_state": true,
//	  "lease_prefetch": true
//	}
//
// Each entry of rate_limits produces at most one descriptor, built from its
// actions in order, as Envoy's route rate_limits do.
package config

import (
	"strconv"
	"strings"
)

// Defaults and bounds.
const (
	DefaultTimeout       = 20 * Millisecond // ns
	MaxTimeout           = 60 * Second      // ns
	DefaultStatusOnError = 500
	DefaultMaxEntries    = 10000
	MaxMaxEntries        = 1000000
	MaxRateLimits        = 64 // descriptors per request
	MaxActions           = 16 // entries per descriptor
	DefaultMaxHeld       = 1000
	MaxMaxHeld           = 100000
)

// FailureMode says what happens to a request when the control plane cannot
// be asked or gives no usable answer.
type FailureMode uint8

const (
	// FailOpen lets the request through.
	FailOpen FailureMode = iota
	// FailClosed answers it locally with StatusOnError.
	FailClosed
)

// String returns the mode as written in the configuration.
func (m FailureMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// Transport is how the filter calls the control plane.
type Transport uint8

const (
	// TransportHTTP sends the gRPC request as an HTTP/2 request through
	// proxy_http_call, framing it and reading the gRPC status itself.
	TransportHTTP Transport = iota
	// TransportGRPC sends it through proxy_grpc_call, the proxy's own gRPC
	// client (the one Envoy's ratelimit filter uses).
	TransportGRPC
)

// String returns the transport as written in the configuration.
func (t Transport) String() string {
	if t == TransportGRPC {
		return "grpc"
	}
	return "http"
}

// ActionKind is what a descriptor entry is taken from.
type ActionKind uint8

const (
	// RemoteAddress is the downstream client's IP address (no port).
	RemoteAddress ActionKind = iota + 1
	// RequestHeader is the value of one request header.
	RequestHeader
	// Path is the request path without the query string.
	Path
	// Method is the request method.
	Method
	// GenericKey is a constant value.
	GenericKey
)

// Default descriptor keys of the actions that have one.
const (
	DefaultRemoteAddressKey = "remote_address"
	DefaultPathKey          = "path"
	DefaultMethodKey        = "method"
	DefaultGenericKey       = "generic_key"
)

// Config is a validated plugin configuration.
type Config struct {
	Cluster       string      // Envoy cluster of the control plane, the proxy_http_call upstream
	Authority     string      // :authority of the gRPC request; defaults to Cluster
	Transport     Transport   // proxy_http_call or proxy_grpc_call
	Domain        string      // rate limit domain sent in every RateLimitRequest
	Timeout       int64       // deadline of one control-plane call, ns
	FailureMode   FailureMode // what to do when the call fails or times out, unless the control plane reported the descriptors' own (package core)
	StatusOnError uint32      // HTTP status of the local reply when failing closed
	RateLimits    []RateLimit // one descriptor each
	Precheck      Precheck    // the local precheck
	Headers       Headers     // which rate limit headers to emit
	// MaxHeld bounds the requests one plugin instance (one per Envoy
	// worker) holds at once while the control plane makes them wait
	// (algorithm reserve); a request beyond it is answered 429.
	MaxHeld int
	// Settle is how the settlements of usage-based rate limits are sent.
	Settle Settle
	// LLM is how LLM requests and answers are read (its defaults when the
	// configuration has no llm object).
	LLM LLM
	// SharedState makes the workers of one proxy share their state (the
	// proxy-wasm host: through shared data): the precheck's over-limit
	// blocks and the lease pools (core.Host's Blocks and Pools). Off, each
	// worker keeps its own, as if it were alone: a benchmark's baseline.
	SharedState bool
	// LeasePrefetch renews the proxy's lease pools before they run out, and
	// as soon as one ends, in calls no request waits on (package lease,
	// renew.go); off, a pool is renewed by the call of a request that
	// found it empty.
	LeasePrefetch bool
}

// RateLimit builds one descriptor from its actions.
type RateLimit struct {
	Actions []Action // entries, in order
	// HitsAddend is the cost of one request for this descriptor: >= 1, or
	// for a usage-based rate limit its reserve (0 = a probe).
	HitsAddend uint32
	// Usage makes the rate limit usage-based (nil: it is not): the actual
	// cost is read from the response and settled at stream end.
	Usage *Usage
}

// Action produces one descriptor entry.
type Action struct {
	Kind            ActionKind
	DescriptorKey   string // the entry's key
	HeaderName      string // RequestHeader: lower-case header name
	DescriptorValue string // GenericKey: the constant value
	SkipIfAbsent    bool   // RequestHeader: leave the entry out instead of the whole descriptor
}

// Precheck configures the local precheck.
type Precheck struct {
	Enabled    bool // reject locally what the control plane is known to reject
	MaxEntries int  // descriptors remembered per plugin instance (LRU)
}

// Headers selects the rate limit headers added to responses.
type Headers struct {
	Draft10    bool // RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-10)
	Legacy     bool // X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset
	RetryAfter bool // Retry-After on 429 replies
	// FailureMode adds x-sluice-failure-mode: open or closed to the
	// response of a request the failure mode decided (the control plane
	// did not answer in time, or not usably).
	FailureMode bool
	// Delayed adds x-sluice-delayed-ms to the response of a request held
	// by shaping (algorithm reserve): how long it was held.
	Delayed bool
}

// FieldError reports an invalid configuration field.
type FieldError struct {
	Field   string // path of the field, e.g. rate_limits[0].actions[1].request_headers.header_name
	Problem string // what is wrong with it
}

// Error implements error.
func (e *FieldError) Error() string {
	if e.Field == "" {
		return "config: " + e.Problem
	}
	return "config: " + e.Field + ": " + e.Problem
}

// Parse parses and validates a configuration document.
func Parse(data []byte) (*Config, error) {
	root, err := parseJSON(data)
	if err != nil {
		return nil, err
	}
	c := &Config{
		Timeout:       DefaultTimeout,
		StatusOnError: DefaultStatusOnError,
		Precheck:      Precheck{Enabled: true, MaxEntries: DefaultMaxEntries},
		Headers:       Headers{Draft10: true, RetryAfter: true},
		MaxHeld:       DefaultMaxHeld,
		Settle:        defaultSettle,
		LLM:           defaultLLM(),
		SharedState:   true,
		LeasePrefetch: true,
	}
	if err := c.decode(root); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) decode(root value) error {
	o, err := asObject(root, "")
	if err != nil {
		return err
	}
	if err := o.only(topFields...); err != nil {
		return err
	}
	if c.Cluster, err = o.requiredString("cluster"); err != nil {
		return err
	}
	if c.Domain, err = o.requiredString("domain"); err != nil {
		return err
	}
	c.Authority = c.Cluster
	if v, ok := o.get("authority"); ok {
		if c.Authority, err = nonEmptyString(v, "authority"); err != nil {
			return err
		}
	}
	if v, ok := o.get("transport"); ok {
		s, err := asString(v, "transport")
		if err != nil {
			return err
		}
		switch s {
		case "http":
			c.Transport = TransportHTTP
		case "grpc":
			c.Transport = TransportGRPC
		default:
			return &FieldError{"transport", "must be \"http\" or \"grpc\", not " + strconv.Quote(s)}
		}
	}
	if v, ok := o.get("timeout"); ok {
		if c.Timeout, err = duration(v, "timeout"); err != nil {
			return err
		}
		if c.Timeout < Millisecond || c.Timeout > MaxTimeout {
			return &FieldError{"timeout", "must be between 1ms and 60s"}
		}
	}
	if v, ok := o.get("failure_mode"); ok {
		s, err := asString(v, "failure_mode")
		if err != nil {
			return err
		}
		switch s {
		case "open":
			c.FailureMode = FailOpen
		case "closed":
			c.FailureMode = FailClosed
		default:
			return &FieldError{"failure_mode", "must be \"open\" or \"closed\", not " + strconv.Quote(s)}
		}
	}
	if v, ok := o.get("status_on_error"); ok {
		n, err := integer(v, "status_on_error", 200, 599)
		if err != nil {
			return err
		}
		c.StatusOnError = uint32(n)
	}
	if v, ok := o.get("llm"); ok {
		if err := c.LLM.decode(v, "llm"); err != nil {
			return err
		}
	}
	v, ok := o.get("rate_limits")
	if !ok {
		return &FieldError{"rate_limits", "is required"}
	}
	if c.RateLimits, err = rateLimits(v, "rate_limits", &c.LLM); err != nil {
		return err
	}
	if v, ok := o.get("precheck"); ok {
		if err := c.Precheck.decode(v, "precheck"); err != nil {
			return err
		}
	}
	if v, ok := o.get("headers"); ok {
		if err := c.Headers.decode(v, "headers"); err != nil {
			return err
		}
	}
	if v, ok := o.get("max_held"); ok {
		n, err := integer(v, "max_held", 0, MaxMaxHeld)
		if err != nil {
			return err
		}
		c.MaxHeld = int(n)
	}
	if v, ok := o.get("settle"); ok {
		if err := c.Settle.decode(v, "settle"); err != nil {
			return err
		}
	}
	if v, ok := o.get("shared_state"); ok {
		if c.SharedState, err = asBool(v, "shared_state"); err != nil {
			return err
		}
	}
	if v, ok := o.get("lease_prefetch"); ok {
		if c.LeasePrefetch, err = asBool(v, "lease_prefetch"); err != nil {
			return err
		}
	}
	return nil
}

func (p *Precheck) decode(v value, field string) error {
	if v.kind == kindBool { // "precheck": false is short for {"enabled": false}
		p.Enabled = v.boolean
		return nil
	}
	o, err := asObject(v, field)
	if err != nil {
		return &FieldError{field, "must be a boolean or an object, not " + v.kind.String()}
	}
	if err := o.only(precheckFields...); err != nil {
		return err
	}
	if v, ok := o.get("enabled"); ok {
		if p.Enabled, err = asBool(v, o.path("enabled")); err != nil {
			return err
		}
	}
	if v, ok := o.get("max_entries"); ok {
		n, err := integer(v, o.path("max_entries"), 1, MaxMaxEntries)
		if err != nil {
			return err
		}
		p.MaxEntries = int(n)
	}
	return nil
}

func (h *Headers) decode(v value, field string) error {
	o, err := asObject(v, field)
	if err != nil {
		return err
	}
	if err := o.only(headersFields...); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		dst  *bool
	}{{"draft10", &h.Draft10}, {"legacy", &h.Legacy}, {"retry_after", &h.RetryAfter},
		{"failure_mode", &h.FailureMode}, {"delayed", &h.Delayed}} {
		if v, ok := o.get(f.name); ok {
			if *f.dst, err = asBool(v, o.path(f.name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func rateLimits(v value, field string, l *LLM) ([]RateLimit, error) {
	if v.kind != kindArray {
		return nil, &FieldError{field, "must be an array, not " + v.kind.String()}
	}
	if len(v.items) == 0 {
		return nil, &FieldError{field, "must hold at least one rate limit"}
	}
	if len(v.items) > MaxRateLimits {
		return nil, &FieldError{field, "must hold at most " + strconv.Itoa(MaxRateLimits) + " rate limits"}
	}
	out := make([]RateLimit, len(v.items))
	for i, item := range v.items {
		path := field + "[" + strconv.Itoa(i) + "]"
		o, err := asObject(item, path)
		if err != nil {
			return nil, err
		}
		if err := o.only(rateLimitFields...); err != nil {
			return nil, err
		}
		out[i].HitsAddend = 1
		if v, ok := o.get("hits_addend"); ok {
			n, err := integer(v, o.path("hits_addend"), 1, 1<<32-1)
			if err != nil {
				return nil, err
			}
			out[i].HitsAddend = uint32(n)
		}
		if uv, ok := o.get("usage"); ok {
			if _, both := o.get("hits_addend"); both {
				return nil, &FieldError{o.path("usage"), "cannot be set with hits_addend: usage.reserve is the request-time cost"}
			}
			if out[i].Usage, err = usage(uv, o.path("usage"), l); err != nil {
				return nil, err
			}
			out[i].HitsAddend = out[i].Usage.Reserve
		}
		av, ok := o.get("actions")
		if !ok {
			return nil, &FieldError{o.path("actions"), "is required"}
		}
		if out[i].Actions, err = actions(av, o.path("actions")); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func actions(v value, field string) ([]Action, error) {
	if v.kind != kindArray {
		return nil, &FieldError{field, "must be an array, not " + v.kind.String()}
	}
	if len(v.items) == 0 {
		return nil, &FieldError{field, "must hold at least one action"}
	}
	if len(v.items) > MaxActions {
		return nil, &FieldError{field, "must hold at most " + strconv.Itoa(MaxActions) + " actions"}
	}
	out := make([]Action, len(v.items))
	for i, item := range v.items {
		path := field + "[" + strconv.Itoa(i) + "]"
		o, err := asObject(item, path)
		if err != nil {
			return nil, err
		}
		if len(o.v.members) != 1 {
			return nil, &FieldError{path, "must have exactly one of remote_address, request_headers, path, method, generic_key"}
		}
		m := o.v.members[0]
		body, err := asObject(m.value, o.path(m.name))
		if err != nil {
			return nil, err
		}
		a := &out[i]
		switch m.name {
		case "remote_address":
			a.Kind = RemoteAddress
			err = body.keyOnly(a, DefaultRemoteAddressKey)
		case "path":
			a.Kind = Path
			err = body.keyOnly(a, DefaultPathKey)
		case "method":
			a.Kind = Method
			err = body.keyOnly(a, DefaultMethodKey)
		case "generic_key":
			a.Kind = GenericKey
			err = body.genericKey(a)
		case "request_headers":
			a.Kind = RequestHeader
			err = body.requestHeaders(a)
		default:
			return nil, &FieldError{o.path(m.name), "is not a known action (remote_address, request_headers, path, method, generic_key)"}
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (o object) keyOnly(a *Action, def string) error {
	if err := o.only(actionFieldsOf(a.Kind)...); err != nil {
		return err
	}
	return o.descriptorKey(a, def)
}

func (o object) descriptorKey(a *Action, def string) error {
	a.DescriptorKey = def
	if v, ok := o.get("descriptor_key"); ok {
		var err error
		if a.DescriptorKey, err = nonEmptyString(v, o.path("descriptor_key")); err != nil {
			return err
		}
	}
	return nil
}

func (o object) genericKey(a *Action) error {
	if err := o.only(actionFieldsOf(GenericKey)...); err != nil {
		return err
	}
	var err error
	if a.DescriptorValue, err = o.requiredString("descriptor_value"); err != nil {
		return err
	}
	return o.descriptorKey(a, DefaultGenericKey)
}

func (o object) requestHeaders(a *Action) error {
	if err := o.only(actionFieldsOf(RequestHeader)...); err != nil {
		return err
	}
	name, err := o.requiredString("header_name")
	if err != nil {
		return err
	}
	if !validHeaderName(name) {
		return &FieldError{o.path("header_name"), "is not a valid header name: " + strconv.Quote(name)}
	}
	a.HeaderName = strings.ToLower(name)
	if a.DescriptorKey, err = o.requiredString("descriptor_key"); err != nil {
		return err
	}
	if v, ok := o.get("skip_if_absent"); ok {
		if a.SkipIfAbsent, err = asBool(v, o.path("skip_if_absent")); err != nil {
			return err
		}
	}
	return nil
}

// actionFieldsOf returns the fields of the action of kind k.
func actionFieldsOf(k ActionKind) []string {
	name := map[ActionKind]string{RemoteAddress: "remote_address", RequestHeader: "request_headers", Path: "path",
		Method: "method", GenericKey: "generic_key"}[k]
	for _, a := range actionFields {
		if a.name == name {
			return a.fields
		}
	}
	return nil
}

// validHeaderName accepts an HTTP token, optionally with a leading ':' for
// the HTTP/2 pseudo-headers (:authority, :path, ...).
func validHeaderName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
