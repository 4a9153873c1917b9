package stack

import "encoding/json"

// DefaultCluster is the control-plane cluster's name in the tests' Envoy
// configurations (envoy/envoy.yaml calls it sluice_controlplane).
const DefaultCluster = "sluice_control_plane"

// PluginConfig is the filter's plugin configuration (filter/core/config), the JSON
// document Envoy hands filter.wasm. Empty optional fields are left out, so
// the filter's defaults apply.
type PluginConfig struct {
	Cluster       string      `json:"cluster"`                   // control-plane cluster name
	Authority     string      `json:"authority,omitempty"`       // :authority of the gRPC call
	Transport     string      `json:"transport,omitempty"`       // "http" (proxy_http_call) or "grpc" (proxy_grpc_call)
	Domain        string      `json:"domain"`                    // rate limit domain
	Timeout       string      `json:"timeout,omitempty"`         // control-plane call deadline, e.g. "50ms"
	FailureMode   string      `json:"failure_mode,omitempty"`    // "open" or "closed"
	StatusOnError int         `json:"status_on_error,omitempty"` // status when failing closed
	RateLimits    []RateLimit `json:"rate_limits"`               // one descriptor each
	Precheck      *Precheck   `json:"precheck,omitempty"`        // local precheck
	Headers       *Headers    `json:"headers,omitempty"`         // rate limit headers to emit
	Settle        *Settle     `json:"settle,omitempty"`          // how usage settlements are sent
	LeasePrefetch *bool       `json:"lease_prefetch,omitempty"`  // renew lease pools off the request path (nil: the filter's default, on)
	LLM           M           `json:"llm,omitempty"`             // how LLM requests and answers are read (docs/llm.md)
}

// RateLimit builds one descriptor from its actions.
type RateLimit struct {
	Actions    []Action `json:"actions"`               // descriptor entries, in order
	HitsAddend int      `json:"hits_addend,omitempty"` // cost of one request
	Usage      *Usage   `json:"usage,omitempty"`       // charge what the response says it cost
}

// Usage makes a rate limit usage-based: a reserve is asked at
// request time, the actual cost is settled at the end of the stream.
type Usage struct {
	Reserve       *int   `json:"reserve,omitempty"`        // cost asked at request time (nil: the filter's default, 1)
	Source        M      `json:"source"`                   // where the cost comes from, e.g. {"response_trailer": "x-usage-tokens"}
	RequestHeader string `json:"request_header,omitempty"` // request-time cost from this header
	Missing       any    `json:"missing,omitempty"`        // "reserve" | "zero" | a number
	OnDisconnect  string `json:"on_disconnect,omitempty"`  // "reserve" | "bytes"
	// LLM traffic (docs/llm.md).
	ReserveFromRequest bool   `json:"reserve_from_request,omitempty"` // size the reserve from the request body
	Cost               string `json:"cost,omitempty"`                 // "tokens" | "weighted"
	Cut                M      `json:"cut,omitempty"`                  // {"slice": n}
	Refund             *bool  `json:"refund,omitempty"`               // nil: the filter's default, true
}

// Settle configures how the filter sends settlements (plugin level).
type Settle struct {
	BatchMax   *int `json:"batch_max,omitempty"`   // settlements per call
	IntervalMS *int `json:"interval_ms,omitempty"` // how often batches are sent (0: at stream end)
	QueueMax   *int `json:"queue_max,omitempty"`   // settlements queued per VM; beyond, lost and counted
	TimeoutMS  *int `json:"timeout_ms,omitempty"`  // deadline of one settle call
}

// Int returns a pointer to n, for the optional numbers of Usage and Settle.
func Int(n int) *int { return &n }

// Action is one descriptor entry: a single-key object such as
// {"remote_address": {}}.
type Action map[string]map[string]string

// Precheck configures the filter's local precheck.
type Precheck struct {
	Enabled    bool `json:"enabled"`               // reject locally what is known to be over limit
	MaxEntries int  `json:"max_entries,omitempty"` // descriptors remembered per VM
}

// Headers selects the rate limit headers the filter emits.
type Headers struct {
	Draft10    bool `json:"draft10"`     // RateLimit-Policy and RateLimit
	Legacy     bool `json:"legacy"`      // X-RateLimit-*
	RetryAfter bool `json:"retry_after"` // Retry-After on 429
	// FailureMode: x-sluice-failure-mode on requests the failure mode decided.
	FailureMode bool `json:"failure_mode,omitempty"`
	// Delayed: x-sluice-delayed-ms on the responses of requests shaping held.
	Delayed bool `json:"delayed,omitempty"`
}

// RemoteAddress is the action for the client's address (key remote_address).
func RemoteAddress() Action { return Action{"remote_address": {}} }

// RequestHeader is the action taking descriptor key from header's value.
func RequestHeader(header, key string) Action {
	return Action{"request_headers": {"header_name": header, "descriptor_key": key}}
}

// Path is the action for the request path (key path).
func Path() Action { return Action{"path": {}} }

// GenericKey is the action for a constant entry.
func GenericKey(key, value string) Action {
	return Action{"generic_key": {"descriptor_key": key, "descriptor_value": value}}
}

// JSON returns the configuration as the filter reads it.
func (c PluginConfig) JSON() []byte {
	b, err := json.Marshal(c)
	if err != nil { // only strings, ints, bools, maps and slices: cannot fail
		panic("stack: marshal plugin config: " + err.Error())
	}
	return b
}
