package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/e2e/stack"
)

// TestBadPluginConfig is scenario 6, first half: the host refuses to start
// the filter with a bad plugin configuration, and the error names the field
// (Envoy would refuse the listener the same way: proxy_on_configure returns
// false and the filter's log line says why).
func TestBadPluginConfig(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		config string
		field  string // what the error must name
	}{
		{"not JSON", `{"cluster": "sluice_control_plane",`, "JSON"},
		{"no cluster", `{"domain": "e2e", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "cluster"},
		{"no domain", `{"cluster": "c", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "domain"},
		{"unknown field", `{"cluster": "c", "domian": "e2e", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "domian"},
		{"bad timeout", `{"cluster": "c", "domain": "e2e", "timeout": "fast", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "timeout"},
		{"timeout out of range", `{"cluster": "c", "domain": "e2e", "timeout": "5m", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "timeout"},
		{"bad failure mode", `{"cluster": "c", "domain": "e2e", "failure_mode": "maybe", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "failure_mode"},
		{"no rate limits", `{"cluster": "c", "domain": "e2e", "rate_limits": []}`, "rate_limits"},
		{"header action without a header", `{"cluster": "c", "domain": "e2e", "rate_limits": [{"actions": [{"request_headers": {"descriptor_key": "api_key"}}]}]}`, "rate_limits[0].actions[0].request_headers.header_name"},
		{"unknown action", `{"cluster": "c", "domain": "e2e", "rate_limits": [{"actions": [{"remote_address": {}}]}, {"actions": [{"cookie": {}}]}]}`, "rate_limits[1].actions[0].cookie"},
		{"status out of range", `{"cluster": "c", "domain": "e2e", "status_on_error": 99, "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "status_on_error"},
		{"precheck of the wrong type", `{"cluster": "c", "domain": "e2e", "precheck": "yes", "rate_limits": [{"actions": [{"remote_address": {}}]}]}`, "precheck"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := stack.StartGateway(ctx, stack.GatewayConfig{
				Wasm: wasm, Plugin: []byte(tc.config), ControlPlane: "127.0.0.1:1",
				Upstream: "http://127.0.0.1:1", CacheDir: cacheDir, Workers: 1,
			})
			if err == nil {
				g.Close(ctx)
				t.Fatalf("the host started the filter with %s", tc.config)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("the error does not name %q:\n%v", tc.field, err)
			}
		})
	}

	// The configuration the other tests use starts, so the cases above fail
	// for the reason they name.
	g, err := stack.StartGateway(ctx, stack.GatewayConfig{
		Wasm: wasm, Plugin: plugin().JSON(), ControlPlane: "127.0.0.1:1",
		Upstream: "http://127.0.0.1:1", CacheDir: cacheDir, Workers: 1,
	})
	if err != nil {
		t.Fatalf("a good configuration is refused: %v", err)
	}
	g.Close(ctx)
}
