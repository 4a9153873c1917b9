package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlscommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// TestRatelimitXDSOwnership: with FORCE_START_WITHOUT_INITIAL_CONFIG=false
// nothing is served before the first xDS configuration; then the xDS
// domains win over a policy file's domain of the same name, the file's other
// domains serve beside them, and the policy service (ratectl) refuses to
// change an xDS-owned domain.
func TestRatelimitXDSOwnership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the service")
	}
	dir := t.TempDir()
	files := filepath.Join(dir, "policies")
	os.MkdirAll(files, 0o755)
	os.WriteFile(filepath.Join(files, "eg.yaml"), []byte("domain: default/eg/http\ndescriptors:\n  - key: r\n    value: r\n    descriptors: [{key: rule-0-match--1, value: rule-0-match--1, rate_limit: {unit: hour, requests_per_unit: 50}}]\n"), 0o644)
	os.WriteFile(filepath.Join(files, "local.yaml"), []byte("domain: local\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644)
	xds := xdstest.Start(t, "127.0.0.1:0", nodeID, nil)
	port, grpcPort, debugPort, policyPort := freePort(t), freePort(t), freePort(t), freePort(t)
	startEnv(t, sluiceBin, []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xds.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + nodeID,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=false", "LOG_LEVEL=info",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(port), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(debugPort),
		"SLUICE_POLICY=" + files, "SLUICE_TOKEN=0123456789abcdef-secret", "SLUICE_POLICY_ADDR=127.0.0.1:" + strconv.Itoa(policyPort),
	}, filepath.Join(dir, "ratelimit.log"))

	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", port)
	short := &http.Client{Timeout: time.Second}
	// Listening (the port is bound at start) but not serving: no answer
	// before the first configuration.
	waitFor(t, "the health port bound", time.Minute, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if code, body := httpGet(short, health); code != 0 {
		t.Fatalf("healthcheck before the first xDS configuration: %d %q, want no answer", code, body)
	}
	xds.Set(t, xdstest.Config(listenerName, xdstest.RouteDescriptor("r", xdstest.Rule{Requests: 3, Unit: hour})))
	hc := &http.Client{Timeout: 10 * time.Second}
	waitFor(t, "healthcheck after the first configuration", time.Minute, func() bool {
		code, _ := httpGet(hc, health)
		return code == 200
	})

	cc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ask := func(domain string, kv ...string) string {
		var entries []*rlscommonv3.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(kv); i += 2 {
			entries = append(entries, &rlscommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: entries}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode().String()
	}
	var answers []string
	for range 4 {
		answers = append(answers, ask(listenerName, "r", "r", "rule-0-match--1", "rule-0-match--1"))
	}
	if got := strings.Join(answers, ","); got != "OK,OK,OK,OVER_LIMIT" {
		t.Errorf("xDS domain (limit 3 over the file's 50): %s", got)
	}
	if got := ask("local", "user", "u") + "," + ask("local", "user", "u"); got != "OK,OVER_LIMIT" {
		t.Errorf("the file's own domain: %s", got)
	}

	pc, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", policyPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer 0123456789abcdef-secret")
	_, err = sluicev1.NewPolicyServiceClient(pc).Apply(ctx, &sluicev1.ApplyRequest{Source: "ratectl",
		Yaml: "domain: default/eg/http\ndescriptors: [{key: r, rate_limit: {unit: hour, requests_per_unit: 1}}]\n"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "xds:") {
		t.Errorf("ratectl apply on an xDS-owned domain: %v, want FailedPrecondition naming the owner", err)
	}
	_, err = sluicev1.NewPolicyServiceClient(pc).Apply(ctx, &sluicev1.ApplyRequest{Source: "ratectl",
		Yaml: "domain: local\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 9}}]\n"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), filepath.Join(files, "local.yaml")) {
		t.Errorf("ratectl apply on the file's domain: %v, want FailedPrecondition naming the file", err)
	}
	if _, err := sluicev1.NewPolicyServiceClient(pc).Apply(ctx, &sluicev1.ApplyRequest{Source: "ratectl",
		Yaml: "domain: other\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 1}}]\n"}); err != nil {
		t.Errorf("ratectl apply on a free domain: %v", err)
	}
	// ratectl list and /rlconfig name each domain's owner.
	list, err := sluicev1.NewPolicyServiceClient(pc).List(ctx, &sluicev1.ListRequest{})
	owners := map[string]string{}
	for _, p := range list.GetPolicies() {
		owners[p.GetDomain()] = p.GetOwner()
	}
	if want := map[string]string{listenerName: "xds:" + listenerName, "local": filepath.Join(files, "local.yaml"), "other": ""}; err != nil || fmt.Sprint(owners) != fmt.Sprint(want) {
		t.Errorf("list: owners %v, %v; want %v", owners, err, want)
	}
	_, rlconfig := httpGet(hc, fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort))
	for _, w := range []string{`# domain "` + listenerName + `", owner xds:` + listenerName, `# domain "local", owner ` + filepath.Join(files, "local.yaml"),
		`# domain "other", owner the policy store (ratectl)`} {
		if !strings.Contains(rlconfig, w) {
			t.Errorf("/rlconfig lacks %q:\n%s", w, rlconfig)
		}
	}
}
