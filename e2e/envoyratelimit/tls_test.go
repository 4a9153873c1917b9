package envoyratelimit

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcerts"
)

// tlsCluster returns stack.GRPCCluster reaching addr over TLS: an
// UpstreamTlsContext that trusts caFile, checks that the server's
// certificate is for sni and, when certFile is set,
// presents that client certificate (mTLS).
func tlsCluster(name, addr, caFile, certFile, keyFile, sni string) stack.M {
	// No alpn_protocols: on an HTTP/2 cluster Envoy offers h2 itself, which
	// grpc-go's server requires.
	common := stack.M{
		"validation_context": stack.M{
			"trusted_ca": stack.M{"filename": caFile},
			"match_typed_subject_alt_names": []stack.M{{
				"san_type": "DNS", "matcher": stack.M{"exact": sni},
			}},
		},
	}
	if certFile != "" {
		common["tls_certificates"] = []stack.M{{
			"certificate_chain": stack.M{"filename": certFile},
			"private_key":       stack.M{"filename": keyFile},
		}}
	}
	c := stack.GRPCCluster(name, addr)
	c["transport_socket"] = stack.M{
		"name": "envoy.transport_sockets.tls",
		"typed_config": stack.M{
			"@type":              "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
			"sni":                sni,
			"common_tls_context": common,
		},
	}
	return c
}

// tlsKeyHeader is the header the TLS test's descriptor comes from.
const tlsKeyHeader = "x-api-key"

// TestEnvoyRateLimitOverMTLS: Envoy's own envoy.filters.http.ratelimit
// calls sluice-controlplane over mTLS (a cluster with an
// UpstreamTlsContext), and the control plane keeps its counts in Redis over
// TLS (tls-auth-clients): a key gets 200 with X-RateLimit-* headers up to
// its limit, then 429. The same Envoy without a client certificate gets no
// decision (500, failure_mode_deny). On both decision servers.
func TestEnvoyRateLimitOverMTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, a control plane and Redis")
	}
	if untilNext(time.Now(), day) < time.Minute {
		t.Skip("within a minute of UTC midnight: the day window would reset mid-test")
	}
	ctx := context.Background()
	dir := t.TempDir()
	certs := testcerts.New(t)
	rs := redistest.StartServer(t, redistest.WithTLS(redistest.TLS{CAFile: certs.CA.File, CertFile: certs.ServerCert, KeyFile: certs.ServerKey}))
	policyFile := filepath.Join(dir, "policy.yaml")
	tlsPolicy := "domain: " + domain + "\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 3}\n"
	if err := os.WriteFile(policyFile, []byte(tlsPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	up, err := stack.StartUpstream("127.0.0.1:0", tlsKeyHeader)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close(ctx) })

	for _, kind := range []string{"unary", "grpc-go"} { // -grpc-server's values
		t.Run(kind, func(t *testing.T) {
			cp, err := stack.StartControlPlane(ctx, stack.ControlPlaneConfig{
				Binary: controlPlane, Dir: dir, Policies: []string{policyFile},
				Args: []string{
					"-grpc-server", kind,
					"-grpc-tls-cert", certs.ServerCert, "-grpc-tls-key", certs.ServerKey, "-grpc-client-ca", certs.CA.File,
					"-redis-addrs", rs.Addr(),
					"-redis-tls-ca", certs.CA.File, "-redis-tls-cert", certs.ClientCert, "-redis-tls-key", certs.ClientKey,
					"-deadline", "2s", // a first Redis call over TLS on a busy machine can take 100s of ms: no degrading mid-count
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cp.Stop()
				if t.Failed() {
					b, _ := os.ReadFile(cp.LogPath())
					t.Logf("control plane log:\n%s", lastLines(string(b), 30))
				}
			})

			// Two listeners: "mtls" decides through a cluster with the client
			// certificate, "nocert" through one without.
			rateLimited := func(listener, cluster string) stack.M {
				route := stack.RouteTo("/", "upstream")
				route["route"].(stack.M)["rate_limits"] = []stack.M{{"actions": []stack.M{{
					"request_headers": stack.M{"header_name": tlsKeyHeader, "descriptor_key": "api_key"},
				}}}}
				return stack.HTTPListener(listener, 0, []stack.M{stack.VirtualHost("all", route)},
					stack.RateLimitFilter(domain, cluster, stack.M{
						"timeout":                    "2s", // the filter's default, 20 ms, is short for a busy test machine
						"failure_mode_deny":          true,
						"enable_x_ratelimit_headers": "DRAFT_VERSION_03",
					}))
			}
			e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: t.TempDir(), Concurrency: 1, LogLevel: "warning",
				Bootstrap: stack.Bootstrap(
					[]stack.M{rateLimited("mtls", "sluice_mtls"), rateLimited("nocert", "sluice_nocert")},
					[]stack.M{
						stack.Cluster("upstream", up.Addr()),
						tlsCluster("sluice_mtls", cp.GRPCAddr(), certs.CA.File, certs.ClientCert, certs.ClientKey, "localhost"),
						tlsCluster("sluice_nocert", cp.GRPCAddr(), certs.CA.File, "", "", "localhost"),
					})})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("envoy log:\n%s", e.LogExcerpt())
				}
				e.Stop()
			})

			client := &http.Client{Timeout: 10 * time.Second}
			send := func(listener string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest("GET", e.URL(listener)+"/", nil)
				req.Header.Set(tlsKeyHeader, "tls-"+kind)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp
			}
			var got []string
			for i := range 4 {
				resp := send("mtls")
				got = append(got, resp.Status+" remaining="+resp.Header.Get("X-RateLimit-Remaining"))
				wantCode := http.StatusOK
				if i == 3 {
					wantCode = http.StatusTooManyRequests
				}
				if resp.StatusCode != wantCode || resp.Header.Get("X-RateLimit-Limit") == "" {
					t.Errorf("request %d: %d, X-RateLimit-Limit %q; want %d with the header", i+1, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), wantCode)
				}
				if i == 3 {
					t.Logf("429 headers: X-RateLimit-Limit: %s, X-RateLimit-Remaining: %s, X-RateLimit-Reset: %s",
						resp.Header.Get("X-RateLimit-Limit"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("X-RateLimit-Reset"))
				}
			}
			t.Logf("through Envoy over mTLS: %s", strings.Join(got, ", "))
			if n := up.ByKey("tls-" + kind); n != 3 {
				t.Errorf("the upstream saw %d requests of the key, want 3", n)
			}
			if n := e.Stat("cluster.sluice_mtls.ssl.handshake"); n < 1 {
				t.Errorf("cluster.sluice_mtls.ssl.handshake = %d, want a TLS handshake", n)
			}
			if resp := send("nocert"); resp.StatusCode != http.StatusInternalServerError {
				t.Errorf("without a client certificate: %d, want 500 (no decision, failure_mode_deny)", resp.StatusCode)
			}
			if ready, why := cp.Ready(); !ready || strings.Contains(why, "degraded") {
				t.Errorf("control plane: ready %v, %q: Redis over TLS should serve", ready, why)
			}
		})
	}
}
