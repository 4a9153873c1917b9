package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/filter/core/llm"
)

const full = `{
  "cluster": "sluice_control_plane",
  "authority": "sluice.internal",
  "transport": "grpc",
  "domain": "edge",
  "timeout": "35ms",
  "failure_mode": "closed",
  "status_on_error": 503,
  "rate_limits": [
    {"actions": [{"remote_address": {}}]},
    {"actions": [
      {"request_headers": {"header_name": "X-Api-Key", "descriptor_key": "api_key", "skip_if_absent": true}},
      {"path": {"descriptor_key": "route"}},
      {"method": {}}
    ], "hits_addend": 3},
    {"actions": [{"generic_key": {"descriptor_value": "all"}}]},
    {"actions": [{"remote_address": {}}], "usage": {"reserve": 0, "source": {"response_trailer": "X-Usage-Tokens"},
      "request_header": "X-Request-Cost", "missing": 7, "on_disconnect": "bytes"}},
    {"actions": [{"remote_address": {}}], "usage": {"source": {"dynamic_metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}}},
    {"actions": [{"remote_address": {}}], "usage": {"reserve": 500, "reserve_from_request": true, "source": {"llm_usage": {}},
      "cost": "weighted", "cut": {"slice": 300}, "refund": false}}
  ],
  "llm": {"max_request_bytes": 1000, "bytes_per_token": 3.25, "default_max_output": 100, "max_event_bytes": 2048, "hold_bytes": 0,
          "weights": [{"model": "*", "input": 1, "output": 2, "cached": 3, "cache_write": 4}]},
  "settle": {"batch_max": 8, "interval_ms": 0, "queue_max": 100, "timeout_ms": 250},
  "precheck": {"enabled": false, "max_entries": 50},
  "headers": {"draft10": false, "legacy": true, "retry_after": false, "failure_mode": true, "delayed": true},
  "max_held": 7,
  "shared_state": false,
  "lease_prefetch": false
}`

// weightsOf is the weight table of the configuration full.
func weightsOf(t *testing.T) *llm.Table {
	w, err := llm.NewTable([]llm.Row{{Model: "*", Input: 1, Output: 2, Cached: 3, CacheWrite: 4, HasCacheWrite: true}})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Cluster:       "sluice_control_plane",
		Authority:     "sluice.internal",
		Transport:     TransportGRPC,
		Domain:        "edge",
		Timeout:       int64(35 * time.Millisecond),
		FailureMode:   FailClosed,
		StatusOnError: 503,
		RateLimits: []RateLimit{
			{HitsAddend: 1, Actions: []Action{{Kind: RemoteAddress, DescriptorKey: "remote_address"}}},
			{HitsAddend: 3, Actions: []Action{
				{Kind: RequestHeader, HeaderName: "x-api-key", DescriptorKey: "api_key", SkipIfAbsent: true},
				{Kind: Path, DescriptorKey: "route"},
				{Kind: Method, DescriptorKey: "method"},
			}},
			{HitsAddend: 1, Actions: []Action{{Kind: GenericKey, DescriptorKey: "generic_key", DescriptorValue: "all"}}},
			{HitsAddend: 0, Actions: []Action{{Kind: RemoteAddress, DescriptorKey: "remote_address"}},
				Usage: &Usage{Reserve: 0, Source: SourceResponseTrailer, Name: "x-usage-tokens", RequestHeader: "x-request-cost",
					Missing: MissingCost, MissingCost: 7, OnDisconnect: DisconnectBytes, Refund: true}},
			{HitsAddend: 1, Actions: []Action{{Kind: RemoteAddress, DescriptorKey: "remote_address"}},
				Usage: &Usage{Reserve: 1, Source: SourceDynamicMetadata, Namespace: "io.envoy.ai_gateway", Key: "llm_total_token", Refund: true}},
			{HitsAddend: 500, Actions: []Action{{Kind: RemoteAddress, DescriptorKey: "remote_address"}},
				Usage: &Usage{Reserve: 500, FromRequest: true, Source: SourceLLMUsage, Cost: CostWeighted, Cut: &Cut{Slice: 300}}},
		},
		LLM:         LLM{MaxRequestBytes: 1000, Ratio: 3250, DefaultMaxOutput: 100, MaxEventBytes: 2048, HoldBytes: 0, Weights: weightsOf(t)},
		Settle:      Settle{BatchMax: 8, IntervalMs: 0, QueueMax: 100, TimeoutMs: 250},
		Precheck:    Precheck{Enabled: false, MaxEntries: 50},
		Headers:     Headers{Draft10: false, Legacy: true, RetryAfter: false, FailureMode: true, Delayed: true},
		MaxHeld:     7,
		SharedState: false,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"cluster":"cp","domain":"d","rate_limits":[{"actions":[{"method":{}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Authority != "cp" || c.Transport != TransportHTTP || c.Timeout != int64(20*time.Millisecond) || c.FailureMode != FailOpen ||
		c.StatusOnError != 500 || !c.Precheck.Enabled || c.Precheck.MaxEntries != DefaultMaxEntries ||
		c.Headers != (Headers{Draft10: true, RetryAfter: true}) || !c.SharedState || !c.LeasePrefetch ||
		c.Settle != (Settle{BatchMax: 64, IntervalMs: 100, QueueMax: 4096, TimeoutMs: 1000}) {
		t.Fatalf("defaults wrong: %+v", c)
	}
	c, err = Parse([]byte(`{"cluster":"cp","domain":"d","precheck":false,"timeout":"0.5s","rate_limits":[{"actions":[{"method":{}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Precheck.Enabled || c.Timeout != int64(500*time.Millisecond) {
		t.Fatalf("precheck shorthand or protobuf-style duration not applied: %+v", c)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	base := func(rl string) string {
		return `{"cluster":"cp","domain":"d","rate_limits":` + rl + `}`
	}
	tests := []struct {
		name, doc, field, problem string
	}{
		{"not object", `[]`, "", "must be a JSON object"},
		{"missing cluster", `{"domain":"d","rate_limits":[]}`, "cluster", "is required"},
		{"empty cluster", `{"cluster":"","domain":"d"}`, "cluster", "must not be empty"},
		{"missing domain", `{"cluster":"c"}`, "domain", "is required"},
		{"domain type", `{"cluster":"c","domain":7}`, "domain", "must be a string, not a number"},
		{"unknown top", `{"cluster":"c","domain":"d","clsuter":1}`, "clsuter", "is not a known field"},
		{"bad timeout", `{"cluster":"c","domain":"d","timeout":"soon"}`, "timeout", "is not a duration"},
		{"timeout number", `{"cluster":"c","domain":"d","timeout":20}`, "timeout", "must be a duration string"},
		{"timeout zero", `{"cluster":"c","domain":"d","timeout":"0s"}`, "timeout", "between 1ms"},
		{"timeout huge", `{"cluster":"c","domain":"d","timeout":"2m"}`, "timeout", "between 1ms"},
		{"failure mode", `{"cluster":"c","domain":"d","failure_mode":"ajar"}`, "failure_mode", `must be "open" or "closed"`},
		{"transport", `{"cluster":"c","domain":"d","transport":"h2"}`, "transport", `must be "http" or "grpc"`},
		{"status", `{"cluster":"c","domain":"d","status_on_error":99}`, "status_on_error", "between 200 and 599"},
		{"status frac", `{"cluster":"c","domain":"d","status_on_error":500.5}`, "status_on_error", "whole number"},
		{"no rate limits", `{"cluster":"c","domain":"d"}`, "rate_limits", "is required"},
		{"empty rate limits", base(`[]`), "rate_limits", "at least one"},
		{"rate limit type", base(`[1]`), "rate_limits[0]", "must be an object, not a number"},
		{"no actions", base(`[{}]`), "rate_limits[0].actions", "is required"},
		{"empty actions", base(`[{"actions":[]}]`), "rate_limits[0].actions", "at least one action"},
		{"unknown rl field", base(`[{"actions":[{"method":{}}],"limit":3}]`), "rate_limits[0].limit", "is not a known field"},
		{"hits zero", base(`[{"actions":[{"method":{}}],"hits_addend":0}]`), "rate_limits[0].hits_addend", "between 1 and"},
		{"two kinds", base(`[{"actions":[{"method":{},"path":{}}]}]`), "rate_limits[0].actions[0]", "exactly one"},
		{"unknown action", base(`[{"actions":[{"method":{}},{"query":{}}]}]`), "rate_limits[0].actions[1].query", "not a known action"},
		{"action body", base(`[{"actions":[{"method":true}]}]`), "rate_limits[0].actions[0].method", "must be an object"},
		{"header name missing", base(`[{"actions":[{"request_headers":{"descriptor_key":"k"}}]}]`), "rate_limits[0].actions[0].request_headers.header_name", "is required"},
		{"header name bad", base(`[{"actions":[{"request_headers":{"header_name":"x y","descriptor_key":"k"}}]}]`), "rate_limits[0].actions[0].request_headers.header_name", "not a valid header name"},
		{"header key missing", base(`[{"actions":[{"request_headers":{"header_name":"x"}}]}]`), "rate_limits[0].actions[0].request_headers.descriptor_key", "is required"},
		{"skip type", base(`[{"actions":[{"request_headers":{"header_name":"x","descriptor_key":"k","skip_if_absent":"yes"}}]}]`), "rate_limits[0].actions[0].request_headers.skip_if_absent", "must be true or false"},
		{"generic value", base(`[{"actions":[{"generic_key":{}}]}]`), "rate_limits[0].actions[0].generic_key.descriptor_value", "is required"},
		{"empty key", base(`[{"actions":[{"path":{"descriptor_key":""}}]}]`), "rate_limits[0].actions[0].path.descriptor_key", "must not be empty"},
		{"remote extra", base(`[{"actions":[{"remote_address":{"v6_prefix":64}}]}]`), "rate_limits[0].actions[0].remote_address.v6_prefix", "is not a known field"},
		{"precheck type", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"precheck":"on"}`, "precheck", "boolean or an object"},
		{"precheck entries", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"precheck":{"max_entries":0}}`, "precheck.max_entries", "between 1 and"},
		{"headers unknown", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"headers":{"draft9":true}}`, "headers.draft9", "is not a known field"},
		{"max_held negative", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"max_held":-1}`, "max_held", "between 0 and"},
		{"max_held too large", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"max_held":100001}`, "max_held", "between 0 and"},
		{"usage type", base(`[{"actions":[{"method":{}}],"usage":1}]`), "rate_limits[0].usage", "must be an object, not a number"},
		{"usage with hits", base(`[{"actions":[{"method":{}}],"hits_addend":2,"usage":{"source":{"response_body_bytes":{}}}}]`), "rate_limits[0].usage", "cannot be set with hits_addend"},
		{"usage unknown", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"reserv":1}}]`), "rate_limits[0].usage.reserv", "is not a known field"},
		{"usage no source", base(`[{"actions":[{"method":{}}],"usage":{"reserve":1}}]`), "rate_limits[0].usage.source", "is required"},
		{"usage two sources", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_header":"a","response_trailer":"b"}}}]`), "rate_limits[0].usage.source", "exactly one of"},
		{"usage unknown source", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_cookie":"a"}}}]`), "rate_limits[0].usage.source.response_cookie", "is not a known source"},
		{"usage header type", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_header":5}}}]`), "rate_limits[0].usage.source.response_header", "must be a string, not a number"},
		{"usage header bad", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_trailer":"x y"}}}]`), "rate_limits[0].usage.source.response_trailer", "not a valid header name"},
		{"usage pseudo header", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_header":":status"}}}]`), "rate_limits[0].usage.source.response_header", "not a valid header name"},
		{"usage metadata key", base(`[{"actions":[{"method":{}}],"usage":{"source":{"dynamic_metadata":{"namespace":"n"}}}}]`), "rate_limits[0].usage.source.dynamic_metadata.key", "is required"},
		{"usage metadata extra", base(`[{"actions":[{"method":{}}],"usage":{"source":{"dynamic_metadata":{"namespace":"n","key":"k","path":"p"}}}}]`), "rate_limits[0].usage.source.dynamic_metadata.path", "is not a known field"},
		{"usage body field", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{"max":1}}}}]`), "rate_limits[0].usage.source.response_body_bytes.max", "is not a known field"},
		{"usage reserve negative", base(`[{"actions":[{"method":{}}],"usage":{"reserve":-1,"source":{"response_body_bytes":{}}}}]`), "rate_limits[0].usage.reserve", "between 0 and"},
		{"usage reserve frac", base(`[{"actions":[{"method":{}}],"usage":{"reserve":1.5,"source":{"response_body_bytes":{}}}}]`), "rate_limits[0].usage.reserve", "whole number"},
		{"usage reserve huge", base(`[{"actions":[{"method":{}}],"usage":{"reserve":4294967296,"source":{"response_body_bytes":{}}}}]`), "rate_limits[0].usage.reserve", "between 0 and 4294967295"},
		{"usage missing word", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"missing":"none"}}]`), "rate_limits[0].usage.missing", `must be "reserve", "zero" or a number`},
		{"usage missing type", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"missing":true}}]`), "rate_limits[0].usage.missing", "not a boolean"},
		{"usage missing negative", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"missing":-3}}]`), "rate_limits[0].usage.missing", "between 0 and"},
		{"usage disconnect", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"on_disconnect":"zero"}}]`), "rate_limits[0].usage.on_disconnect", `must be "reserve" or "bytes"`},
		{"usage request header", base(`[{"actions":[{"method":{}}],"usage":{"source":{"response_body_bytes":{}},"request_header":""}}]`), "rate_limits[0].usage.request_header", "must not be empty"},
		{"llm type", llmDoc(`{"source":{"llm_usage":{}}}`, `[]`), "llm", "must be an object, not an array"},
		{"llm unknown", llmDoc(`{"source":{"llm_usage":{}}}`, `{"max_body":1}`), "llm.max_body", "is not a known field"},
		{"llm body bytes", llmDoc(`{"source":{"llm_usage":{}}}`, `{"max_request_bytes":0}`), "llm.max_request_bytes", "between 1 and"},
		{"llm ratio", llmDoc(`{"source":{"llm_usage":{}}}`, `{"bytes_per_token":0.1}`), "llm.bytes_per_token", "between 0.5 and 64"},
		{"llm ratio type", llmDoc(`{"source":{"llm_usage":{}}}`, `{"bytes_per_token":"4"}`), "llm.bytes_per_token", "must be a number"},
		{"llm event bytes", llmDoc(`{"source":{"llm_usage":{}}}`, `{"max_event_bytes":10}`), "llm.max_event_bytes", "between 1024 and"},
		{"weights type", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":{}}`), "llm.weights", "must be an array"},
		{"weights no default", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"model":"gpt-4o","input":1}]}`), "llm.weights", `needs a default row (model "*")`},
		{"weights negative", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"model":"*"},{"model":"gpt-4o","output":-1}]}`), "llm.weights[1].output", "must be between 0 and"},
		{"weights model", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"model":"*"},{"model":"gpt-*-mini"}]}`), "llm.weights[1].model", `may hold "*" only as its last character`},
		{"weights duplicate", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"model":"*"},{"model":"*"}]}`), "llm.weights[1].model", "is also row 0"},
		{"weights row field", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"model":"*","inputs":1}]}`), "llm.weights[0].inputs", "is not a known field"},
		{"weights row model", llmDoc(`{"source":{"llm_usage":{}}}`, `{"weights":[{"input":1}]}`), "llm.weights[0].model", "is required"},
		{"cost word", llmDoc(`{"source":{"llm_usage":{}},"cost":"dollars"}`, `{}`), "rate_limits[0].usage.cost", `must be "tokens" or "weighted"`},
		{"cost source", llmDoc(`{"source":{"response_header":"x-u"},"cost":"tokens"}`, `{}`), "rate_limits[0].usage.cost", "needs the source llm_usage"},
		{"cost no table", llmDoc(`{"source":{"llm_usage":{}},"cost":"weighted"}`, `{}`), "rate_limits[0].usage.cost", "needs the weight table llm.weights"},
		{"cut no slice", llmDoc(`{"source":{"llm_usage":{}},"cut":{}}`, `{}`), "rate_limits[0].usage.cut.slice", "is required"},
		{"cut slice zero", llmDoc(`{"source":{"llm_usage":{}},"cut":{"slice":0}}`, `{}`), "rate_limits[0].usage.cut.slice", "between 1 and"},
		{"cut source", llmDoc(`{"source":{"response_trailer":"x-u"},"cut":{"slice":5}}`, `{}`), "rate_limits[0].usage.cut", "needs the source llm_usage"},
		{"reserve two ways", llmDoc(`{"source":{"llm_usage":{}},"request_header":"x-r","reserve_from_request":true}`, `{}`), "rate_limits[0].usage.reserve_from_request", "cannot be set with request_header"},
		{"refund type", llmDoc(`{"source":{"llm_usage":{}},"refund":"yes"}`, `{}`), "rate_limits[0].usage.refund", "must be true or false"},
		{"settle type", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":[]}`, "settle", "must be an object, not an array"},
		{"settle unknown", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"batch":2}}`, "settle.batch", "is not a known field"},
		{"settle batch zero", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"batch_max":0}}`, "settle.batch_max", "between 1 and 64"},
		{"settle batch big", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"batch_max":65}}`, "settle.batch_max", "between 1 and 64"},
		{"settle interval", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"interval_ms":-1}}`, "settle.interval_ms", "between 0 and 60000"},
		{"settle queue", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"queue_max":0}}`, "settle.queue_max", "between 1 and 65536"},
		{"settle timeout type", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"settle":{"timeout_ms":"1s"}}`, "settle.timeout_ms", "must be a number, not a string"},
		{"shared_state type", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"shared_state":"no"}`, "shared_state", "must be true or false"},
		{"headers type", `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}]}],"headers":{"legacy":1}}`, "headers.legacy", "must be true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FieldError", err)
			}
			if fe.Field != tt.field || !strings.Contains(fe.Problem, tt.problem) {
				t.Fatalf("got field %q problem %q, want field %q problem containing %q", fe.Field, fe.Problem, tt.field, tt.problem)
			}
			if tt.field != "" && !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("message %q does not name the field", err)
			}
		})
	}
}

// llmDoc is a configuration of one rate limit with usage object usage and
// the llm object llm.
func llmDoc(usage, llm string) string {
	return `{"cluster":"c","domain":"d","rate_limits":[{"actions":[{"method":{}}],"usage":` + usage + `}],"llm":` + llm + `}`
}

func TestParseTooMany(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"cluster":"c","domain":"d","rate_limits":[`)
	for i := 0; i <= MaxRateLimits; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"actions":[{"method":{}}]}`)
	}
	b.WriteString(`]}`)
	_, err := Parse([]byte(b.String()))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "rate_limits" {
		t.Fatalf("got %v", err)
	}
}

// TestFieldsAccepted: every path Fields lists is accepted by Parse, and a
// name next to them is refused, so the list is the parser's.
func TestFieldsAccepted(t *testing.T) {
	if !strings.Contains(strings.Join(Fields(), " "), "headers.failure_mode") {
		t.Fatalf("Fields lacks headers.failure_mode: %v", Fields())
	}
	for _, f := range Fields() {
		doc := docWith(f, false)
		if _, err := Parse([]byte(doc)); err != nil && strings.Contains(err.Error(), "is not a known field") {
			t.Errorf("%s: %v\n%s", f, err, doc)
		}
		bad := docWith(f, true)
		if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "is not a known field") {
			t.Errorf("%s: an unknown neighbour was not refused: %v\n%s", f, err, bad)
		}
	}
}

// docWith returns a minimal valid configuration that sets the field at
// path (to a plausible value), or an unknown field beside it when bogus.
func docWith(path string, bogus bool) string {
	parts := strings.Split(path, ".")
	leaf := parts[len(parts)-1]
	if bogus {
		leaf = "bogus_" + leaf
	}
	val := map[string]string{"enabled": "true", "max_entries": "5", "draft10": "true", "legacy": "true", "retry_after": "true",
		"failure_mode": `"open"`, "delayed": "true", "hits_addend": "2", "skip_if_absent": "true", "timeout": `"5ms"`,
		"status_on_error": "503", "max_held": "3", "shared_state": "false", "lease_prefetch": "false", "precheck": "true", "headers": "{}", "header_name": `"x-a"`}[leaf]
	if strings.HasPrefix(path, "headers.") {
		val = strings.Replace(val, `"open"`, "true", 1)
	}
	if val == "" {
		val = `"v"`
	}
	base := map[string]string{"cluster": `"c"`, "domain": `"d"`}
	rl := `[{"actions": [{"remote_address": {}}]}]`
	if doc, ok := usageDocWith(parts, leaf, bogus); ok {
		return doc
	}
	switch {
	case len(parts) == 1 && (leaf == "rate_limits" || leaf == "cluster" || leaf == "domain"):
		// always present
		if bogus {
			return `{"cluster": "c", "domain": "d", "rate_limits": ` + rl + `, "` + leaf + `": 1}`
		}
	case len(parts) == 1:
		base[leaf] = val
	case parts[0] == "precheck" || parts[0] == "headers":
		base[parts[0]] = `{"` + leaf + `": ` + val + `}`
	case path == "rate_limits[].actions":
		if bogus {
			rl = `[{"actions": [{"remote_address": {}}], "bogus_actions": 1}]`
		}
	case path == "rate_limits[].hits_addend":
		rl = `[{"actions": [{"remote_address": {}}], "` + leaf + `": 2}]`
	case len(parts) == 3: // an action
		body := map[string]string{"request_headers": `{"header_name": "x-a", "descriptor_key": "k"}`,
			"generic_key": `{"descriptor_value": "v"}`}[leaf]
		if body == "" {
			body = "{}"
		}
		if bogus {
			// an unknown action is refused as such
			return `{"cluster": "c", "domain": "d", "rate_limits": [{"actions": [{"remote_address": {"bogus": 1}}]}]}`
		}
		rl = `[{"actions": [{"` + leaf + `": ` + body + `}]}]`
	default: // an action's field
		action := parts[2]
		fields := map[string]string{"request_headers": `"header_name": "x-a", "descriptor_key": "k"`,
			"generic_key": `"descriptor_value": "v"`}[action]
		set := `"` + leaf + `": ` + val
		if fields != "" && !bogus && strings.Contains(fields, `"`+leaf+`"`) {
			set = ""
		}
		all := strings.Trim(strings.Join([]string{fields, set}, ", "), ", ")
		rl = `[{"actions": [{"` + action + `": {` + all + `}}]}]`
	}
	out := `{"rate_limits": ` + rl
	for k, v := range base {
		out += `, "` + k + `": ` + v
	}
	return out + "}"
}

// usageDocWith is docWith for the usage and settle fields; ok is false for
// the others.
func usageDocWith(parts []string, leaf string, bogus bool) (doc string, ok bool) {
	const head = `{"cluster": "c", "domain": "d", `
	const rlHead = `"rate_limits": [{"actions": [{"remote_address": {}}]`
	source := `{"response_body_bytes": {}}`
	switch {
	case parts[0] == "settle" && len(parts) == 1:
		return head + `"rate_limits": [{"actions": [{"remote_address": {}}]}], "` + leaf + `": {}}`, true
	case parts[0] == "settle":
		return head + `"rate_limits": [{"actions": [{"remote_address": {}}]}], "settle": {"` + leaf + `": 5}}`, true
	case parts[0] == "llm" && len(parts) == 2:
		val := map[string]string{"weights": `[{"model": "*"}]`, "bytes_per_token": "3.5"}[strings.TrimPrefix(leaf, "bogus_")]
		if val == "" {
			val = "2048"
		}
		return head + rlHead + `}], "llm": {"` + leaf + `": ` + val + `}}`, true
	case parts[0] == "llm" && len(parts) == 3: // a weight row's field
		row := `"model": "*"`
		if leaf != "model" {
			row += `, "` + leaf + `": 1`
		}
		return head + rlHead + `}], "llm": {"weights": [{` + row + `}]}}`, true
	case len(parts) < 2 || parts[1] != "usage":
		return "", false
	case len(parts) == 4 && parts[2] == "cut": // cut.slice
		return head + rlHead + `, "usage": {"source": {"llm_usage": {}}, "cut": {"` + leaf + `": 5}}}]}`, true
	case len(parts) == 2:
		return head + rlHead + `, "` + leaf + `": {"source": ` + source + `}}]}`, true
	case len(parts) == 3: // a usage field
		val := map[string]string{"reserve": "0", "request_header": `"x-cost"`, "missing": `"zero"`, "on_disconnect": `"bytes"`,
			"refund": "false", "reserve_from_request": "true", "cost": `"tokens"`, "cut": `{"slice": 5}`}[strings.TrimPrefix(leaf, "bogus_")]
		if strings.Contains("cost cut", strings.TrimPrefix(leaf, "bogus_")) {
			source = `{"llm_usage": {}}`
		}
		if parts[2] == "source" {
			if bogus {
				return head + rlHead + `, "usage": {"source": ` + source + `, "bogus_source": 1}}]}`, true
			}
			return head + rlHead + `, "usage": {"source": ` + source + `}}]}`, true
		}
		return head + rlHead + `, "usage": {"source": ` + source + `, "` + leaf + `": ` + val + `}}]}`, true
	case len(parts) == 4: // a source
		body := map[string]string{"response_header": `"x-u"`, "response_trailer": `"x-u"`,
			"dynamic_metadata": `{"namespace": "n", "key": "k"}`, "response_body_bytes": `{}`, "llm_usage": `{}`}[parts[3]]
		if bogus {
			return head + rlHead + `, "usage": {"source": {"response_body_bytes": {"bogus": 1}}}}]}`, true
		}
		return head + rlHead + `, "usage": {"source": {"` + parts[3] + `": ` + body + `}}}]}`, true
	default: // a dynamic_metadata field
		md := `"namespace": "n", "key": "k"`
		if bogus {
			md += `, "` + leaf + `": "v"`
		}
		return head + rlHead + `, "usage": {"source": {"dynamic_metadata": {` + md + `}}}}]}`, true
	}
}
