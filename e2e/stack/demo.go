package stack

// DemoDomain is the domain of controlplane/policy/example.yaml.
const DemoDomain = "sluice-demo"

// DemoPlugin returns the plugin configuration matching the example policies
// (controlplane/policy/example.yaml): one descriptor per client address, one
// per API key (header x-api-key, when present) and one per path.
func DemoPlugin() PluginConfig {
	return PluginConfig{
		Cluster:     DefaultCluster,
		Domain:      DemoDomain,
		Timeout:     "100ms",
		FailureMode: "open",
		RateLimits: []RateLimit{
			{Actions: []Action{RemoteAddress()}},
			{Actions: []Action{RequestHeader("x-api-key", "api_key")}},
			{Actions: []Action{Path()}},
		},
		Precheck: &Precheck{Enabled: true},
		Headers:  &Headers{Draft10: true, RetryAfter: true},
	}
}
