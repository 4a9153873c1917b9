package config

// The fields each object of the configuration accepts; any other is refused
// ("is not a known field"). Fields lists them all for the reference
// documentation's test (docs/filter.md).
var (
	topFields       = []string{"cluster", "authority", "transport", "domain", "timeout", "failure_mode", "status_on_error", "rate_limits", "precheck", "headers", "max_held", "settle", "shared_state", "lease_prefetch", "llm"}
	rateLimitFields = []string{"actions", "hits_addend", "usage"}
	usageFields     = []string{"reserve", "source", "request_header", "missing", "on_disconnect", "refund", "reserve_from_request", "cost", "cut"}
	// usageSourceFields are the sources of usage.source, one of which is set.
	usageSourceFields     = []string{"response_header", "response_trailer", "dynamic_metadata", "response_body_bytes", "llm_usage"}
	dynamicMetadataFields = []string{"namespace", "key"}
	settleFields          = []string{"batch_max", "interval_ms", "queue_max", "timeout_ms"}
	llmFields             = []string{"max_request_bytes", "bytes_per_token", "default_max_output", "max_event_bytes", "hold_bytes", "weights"}
	weightFields          = []string{"model", "input", "output", "cached", "cache_write"}
	precheckFields        = []string{"enabled", "max_entries"}
	headersFields         = []string{"draft10", "legacy", "retry_after", "failure_mode", "delayed"}
	// actionFields are the actions and each one's fields.
	actionFields = []struct {
		name   string
		fields []string
	}{
		{"remote_address", []string{"descriptor_key"}},
		{"request_headers", []string{"header_name", "descriptor_key", "skip_if_absent"}},
		{"path", []string{"descriptor_key"}},
		{"method", []string{"descriptor_key"}},
		{"generic_key", []string{"descriptor_key", "descriptor_value"}},
	}
)

// Fields returns the path of every field the configuration accepts, as the
// documentation writes them: "headers.draft10",
// "rate_limits[].actions[].request_headers.header_name".
func Fields() []string {
	var out []string
	out = append(out, topFields...)
	for _, f := range rateLimitFields {
		out = append(out, "rate_limits[]."+f)
	}
	for _, f := range usageFields {
		out = append(out, "rate_limits[].usage."+f)
	}
	for _, f := range usageSourceFields {
		out = append(out, "rate_limits[].usage.source."+f)
	}
	for _, f := range dynamicMetadataFields {
		out = append(out, "rate_limits[].usage.source.dynamic_metadata."+f)
	}
	out = append(out, "rate_limits[].usage.cut.slice")
	for _, f := range settleFields {
		out = append(out, "settle."+f)
	}
	for _, f := range llmFields {
		out = append(out, "llm."+f)
	}
	for _, f := range weightFields {
		out = append(out, "llm.weights[]."+f)
	}
	for _, a := range actionFields {
		out = append(out, "rate_limits[].actions[]."+a.name)
		for _, f := range a.fields {
			out = append(out, "rate_limits[].actions[]."+a.name+"."+f)
		}
	}
	for _, f := range precheckFields {
		out = append(out, "precheck."+f)
	}
	for _, f := range headersFields {
		out = append(out, "headers."+f)
	}
	return out
}
