package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// libsluice.so in real Envoy: a good plugin configuration is accepted and
// requests pass; a bad one is refused whole, naming its field, and Envoy
// does not start on it.
func TestConfigurationCheckedInEnvoy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the module and runs Envoy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	if _, err := stack.BuildNativeModule(ctx, "./filter/native", dir, "sluice"); err != nil {
		t.Fatal(err)
	}
	start := func(name, conf string) (*stack.Envoy, error) {
		boot := stack.Bootstrap(
			[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.DirectResponse("/", 200, "ok\n"))},
				stack.NativeFilter("sluice", "sluice", []byte(conf), ""))},
			[]stack.M{stack.GRPCCluster("sluice_controlplane", "127.0.0.1:1")},
		)
		return stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Name: name, Bootstrap: boot, Concurrency: 1})
	}

	e, err := start("good", `{"cluster":"sluice_controlplane","domain":"example","rate_limits":[{"actions":[{"remote_address":{}}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	resp, err := http.Get(e.URL("in") + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d through the module, want 200", resp.StatusCode)
	}
	if log := e.Log(); !strings.Contains(log, `configuration of domain "example" accepted`) {
		t.Errorf("Envoy's log lacks the module's acceptance:\n%s", e.LogExcerpt())
	}

	_, err = start("bad", `{"cluster":"sluice_controlplane","domian":"example"}`)
	if err == nil {
		t.Fatal("Envoy started on a plugin configuration with a misspelt field")
	}
	if !strings.Contains(err.Error(), "domian") {
		t.Errorf("the refusal does not name the field domian: %v", err)
	}
}
