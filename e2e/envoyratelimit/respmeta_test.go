package envoyratelimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// metadataPolicy gives two descriptors metadata (envoyproxy/ratelimit's
// newest key), one in quota_mode.
const metadataPolicy = `
domain: meta
descriptors:
  - key: plan
    value: team-*-prod
    quota_mode: true
    metadata: {tier: premium, route: {pool: a}}
    rate_limit: {unit: day, requests_per_unit: 1}
`

// TestResponseMetadataEnvoy: with -response-dynamic-metadata, the metadata
// of the passed descriptors reaches Envoy, which puts it in the stream's
// dynamic metadata under envoy.filters.http.ratelimit (a Lua filter copies
// it to a response header), from both decision servers' encoders; and a
// quota_mode descriptor over its limit alone does not refuse the request.
func TestResponseMetadataEnvoy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy and control planes")
	}
	if untilNext(time.Now(), 24*time.Hour) < time.Minute {
		t.Skip("within a minute of UTC midnight: the day window would reset mid-test")
	}
	for _, server := range []string{"unary", "grpc-go"} {
		t.Run(server, func(t *testing.T) {
			dir := t.TempDir()
			rls := startSluice(t, dir, "", metadataPolicy, "-response-dynamic-metadata", "-grpc-server", server)
			up, err := stack.StartUpstream("127.0.0.1:0", "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { up.Close(context.Background()) })
			route := stack.RouteTo("/", "up")
			route["route"].(stack.M)["rate_limits"] = []stack.M{{"actions": []stack.M{
				{"request_headers": stack.M{"header_name": "x-plan", "descriptor_key": "plan"}}}}}
			lua := stack.M{
				"name": "envoy.filters.http.lua",
				"typed_config": stack.M{
					"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
					"default_source_code": stack.M{"inline_string": `
function envoy_on_response(h)
  local md = h:streamInfo():dynamicMetadata():get("envoy.filters.http.ratelimit")
  if md and md.metadata then
    h:headers():add("x-tier", tostring(md.metadata.tier))
    h:headers():add("x-pool", tostring(md.metadata.route.pool))
  end
  if md and md.domain then
    h:headers():add("x-domain", md.domain)
  end
end`},
				},
			}
			rl := stack.RateLimitFilter("meta", "rls", stack.M{"timeout": "1s"})
			boot := stack.Bootstrap(
				[]stack.M{stack.HTTPListener("meta", 0, []stack.M{stack.VirtualHost("all", route)}, lua, rl)},
				[]stack.M{stack.Cluster("up", up.Addr()), stack.GRPCCluster("rls", rls)})
			e := startEnvoy(t, context.Background(), stack.EnvoyConfig{Dir: dir, Bootstrap: boot})
			get := func(plan string) *http.Response {
				req, err := http.NewRequest("GET", e.URL("meta")+"/", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("x-plan", plan)
				resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			plan := "team-" + server + "-prod"
			r := get(plan)
			if r.StatusCode != 200 || r.Header.Get("x-tier") != "premium" || r.Header.Get("x-pool") != "a" || r.Header.Get("x-domain") != "meta" {
				t.Fatalf("first request: %d, x-tier %q, x-pool %q, x-domain %q", r.StatusCode, r.Header.Get("x-tier"), r.Header.Get("x-pool"), r.Header.Get("x-domain"))
			}
			// Over its limit, the only (quota_mode) descriptor is every quota
			// descriptor: refused; its metadata is no longer returned.
			r = get(plan)
			if r.StatusCode != 429 || r.Header.Get("x-tier") != "" {
				t.Fatalf("second request: %d, x-tier %q", r.StatusCode, r.Header.Get("x-tier"))
			}
		})
	}
}
