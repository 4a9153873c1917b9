package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlscommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/otlptest"
)

// TestRatelimitFileModeAndTracing runs sluice as `ratelimit` with
// CONFIG_TYPE=FILE (the runtime directory) and TRACING_ENABLED, once per
// exporter protocol: ShouldRateLimit is traced as a child of the
// traceparent the caller sent, /healthcheck and /rlconfig answer, and an
// unsupported setting is logged.
func TestRatelimitFileModeAndTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the service")
	}
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "data", "ratelimit", "config")
			os.MkdirAll(conf, 0o755)
			os.WriteFile(filepath.Join(conf, "api.yaml"), []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644)
			rcv := otlptest.Start(t, protocol)
			port, grpcPort, debugPort := freePort(t), freePort(t), freePort(t)
			e := []string{
				"RUNTIME_ROOT=" + filepath.Join(dir, "data"), "RUNTIME_SUBDIRECTORY=ratelimit", "CONFIG_TYPE=FILE",
				"LOG_LEVEL=info", "HOST=127.0.0.1", "PORT=" + strconv.Itoa(port), "GRPC_HOST=127.0.0.1",
				"GRPC_PORT=" + strconv.Itoa(grpcPort), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(debugPort),
				"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=envoy-ratelimit", "TRACING_SERVICE_NAMESPACE=envoy-gateway-system",
				"TRACING_SAMPLING_RATE=1.0", "TRACING_EXPORTER_PROTOCOL=" + protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.Endpoint, "OTEL_BSP_SCHEDULE_DELAY=100",
				"SHADOW_MODE=true",
			}
			logPath := filepath.Join(dir, "ratelimit.log")
			startEnv(t, sluiceBin, e, logPath)
			hc := &http.Client{Timeout: 10 * time.Second}
			waitFor(t, "healthcheck", time.Minute, func() bool {
				code, body := httpGet(hc, fmt.Sprintf("http://127.0.0.1:%d/healthcheck", port))
				return code == 200 && body == "OK"
			})
			if code, body := httpGet(hc, fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort)); code != 200 || !strings.Contains(body, `domain "api"`) || !strings.Contains(body, "requests_per_unit: 1") {
				t.Errorf("/rlconfig: %d %q", code, body)
			}

			cc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			traceID := []byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
			parent := []byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent",
				fmt.Sprintf("00-%x-%x-01", traceID, parent))
			var codes []string
			for range 2 {
				resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}}})
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, resp.GetOverallCode().String())
			}
			if got := strings.Join(codes, ","); got != "OK,OVER_LIMIT" {
				t.Errorf("decisions from the runtime directory: %s, want OK,OVER_LIMIT", got)
			}
			waitFor(t, "span exported", 30*time.Second, func() bool { return rcv.Span("ShouldRateLimit", traceID) != nil })
			s := rcv.Span("ShouldRateLimit", traceID)
			if string(s.GetParentSpanId()) != string(parent) || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span parent %x kind %v, want parent %x, server", s.GetParentSpanId(), s.GetKind(), parent)
			}
			attrs := map[string]string{}
			for _, a := range s.GetAttributes() {
				attrs[a.GetKey()] = a.GetValue().GetStringValue()
			}
			if attrs["ratelimit.domain"] != "api" {
				t.Errorf("span attributes %v: want ratelimit.domain api", attrs)
			}
			b, _ := os.ReadFile(logPath)
			if !strings.Contains(string(b), "SHADOW_MODE=true") {
				t.Errorf("the unsupported SHADOW_MODE was not logged:\n%s", b)
			}
		})
	}
}

func httpGet(hc *http.Client, url string) (int, string) {
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
