package abi

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// guestFilter returns the guest module as a Wasm filter with its own plugin
// name and VM, and Envoy's failure_policy for a failed VM ("" = Envoy's
// default, FAIL_CLOSED).
func guestFilter(wasm, name, failurePolicy, config string) stack.M {
	f := stack.WasmFilter(wasm, []byte(config))
	cfg := f["typed_config"].(stack.M)["config"].(stack.M)
	cfg["name"], cfg["root_id"] = name, name
	cfg["vm_config"].(stack.M)["vm_id"] = name
	if failurePolicy != "" {
		cfg["failure_policy"] = failurePolicy
	}
	return f
}

// TestTrappedVM traps a VM with a Go panic that nothing recovers (the guest
// module's /trap; sluice's filter recovers its panics and applies its
// failure mode instead). Envoy then answers 503. With failure_policy
// FAIL_RELOAD (envoy.yaml's) it loads a fresh VM after a backoff and serves
// again, counting wasm.<plugin>.vm_reload_success; with the default,
// FAIL_CLOSED, the VM stays failed and every request gets 503. The guest's
// ticks (proxy_on_tick, counted in a metric of its own) show in /stats.
func TestTrappedVM(t *testing.T) {
	_, guest := programs(t)
	ctx := context.Background()
	dir := t.TempDir()
	direct := []stack.M{stack.VirtualHost("all", stack.DirectResponse("/", 200, "ok\n"))}
	e, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: dir, Concurrency: 1, Bootstrap: stack.Bootstrap(
		[]stack.M{
			stack.HTTPListener("reload", 0, direct, guestFilter(guest, "reload", "FAIL_RELOAD", "tick_ms=20")),
			stack.HTTPListener("closed", 0, direct, guestFilter(guest, "closed", "", "")),
		}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	client := &http.Client{Timeout: 10 * time.Second}

	if !waitFor(10*time.Second, func() bool { return e.Stat("wasmcustom.guest_ticks") >= 5 }) {
		t.Errorf("proxy_on_tick: %d ticks in 10 s at 20 ms", e.Stat("wasmcustom.guest_ticks"))
	}
	for _, l := range []string{"reload", "closed"} {
		if a := get(t, client, e.URL(l)+"/"); a.code != 200 {
			t.Fatalf("%s: %d before the trap", l, a.code)
		}
		if a := get(t, client, e.URL(l)+"/trap"); a.code != 503 {
			t.Errorf("%s: the trapping request got %d, want 503", l, a.code)
		}
	}
	// Envoy 1.39 and 1.40 log what the Go runtime writes to stderr (the
	// panic) as wasm errors; Envoy 1.36 and 1.37 do not.
	if !waitFor(5*time.Second, func() bool { return strings.Contains(e.Log(), "assignment to entry in nil map") }) {
		t.Logf("the guest's panic message is not in Envoy's log")
	}

	start := time.Now()
	var codes []int
	reloaded := waitFor(30*time.Second, func() bool {
		a := get(t, client, e.URL("reload")+"/")
		codes = append(codes, a.code)
		return a.code == 200
	})
	t.Logf("FAIL_RELOAD: served again after %v (%d requests: %v); vm_reload_success %d, vm_reload_backoff %d",
		time.Since(start).Round(time.Millisecond), len(codes), compact(codes),
		e.Stat("wasm.reload.vm_reload_success"), e.Stat("wasm.reload.vm_reload_backoff"))
	if !reloaded || e.Stat("wasm.reload.vm_reload_success") < 1 {
		t.Errorf("FAIL_RELOAD: no reload within 30 s (codes %v)", compact(codes))
	}
	for range 5 {
		if a := get(t, client, e.URL("closed")+"/"); a.code != 503 {
			t.Errorf("FAIL_CLOSED: %d after the trap, want 503 for good", a.code)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := e.Stat("wasm.closed.vm_reload_success"); n != 0 {
		t.Errorf("FAIL_CLOSED reloaded the VM %d times", n)
	}
}

// compact shortens a list of status codes: 503 x 12, 200.
func compact(codes []int) string {
	var b strings.Builder
	for i := 0; i < len(codes); {
		j := i
		for j < len(codes) && codes[j] == codes[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(codes[i]))
		if j-i > 1 {
			b.WriteString(" x " + strconv.Itoa(j-i))
		}
		i = j
	}
	return b.String()
}

// TestBadConfiguration: proxy_on_configure refuses a plugin configuration
// with a bad field; Envoy does not start, and its log names the field.
func TestBadConfiguration(t *testing.T) {
	progs, _ := programs(t)
	ctx := context.Background()
	for _, tt := range []struct{ name, json, field string }{
		{"bad value", `{"cluster": "c", "domain": "d", "timeout": "soon", "rate_limits": [{"actions": [{"path": {}}]}]}`, "timeout"},
		{"unknown field", `{"cluster": "c", "domain": "d", "rate_limitz": []}`, "rate_limitz"},
		{"not JSON", `{"cluster": `, "JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := stack.StartEnvoy(ctx, stack.EnvoyConfig{Dir: t.TempDir(), Concurrency: 1, Bootstrap: stack.Bootstrap(
				[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.DirectResponse("/", 200, "ok"))},
					stack.WasmFilter(progs.Wasm, []byte(tt.json)))},
				[]stack.M{stack.GRPCCluster("c", "127.0.0.1:1")})})
			if err == nil {
				t.Fatalf("Envoy started with %s", tt.json)
			}
			msg := err.Error()
			if !strings.Contains(msg, "sluice: invalid plugin configuration") || !strings.Contains(msg, tt.field) {
				t.Errorf("Envoy's log does not name %s:\n%s", tt.field, msg)
			}
		})
	}
}
