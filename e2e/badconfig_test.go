package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
)

// badPlugins are plugin configurations the filter refuses, each with what
// its error must name.
var badPlugins = []struct {
	name   string
	config string
	field  string // what Envoy's log must name
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
}

// TestBadPluginConfig is scenario 6, first half: real Envoy refuses a bad
// plugin configuration, and its log names the field: the filter's
// proxy_on_configure returns false after logging why, and Envoy fails to
// create the Wasm plugin.
//
// A running Envoy (listeners from a file, as from a control plane's LDS)
// rejects each bad configuration as a listener update, logs the filter's
// line, and keeps serving its good listener through the filter: the Wasm VM
// the bad plugin would have shared is not harmed. At start-up, an Envoy whose
// bootstrap holds a bad configuration exits, and StartEnvoy's error carries
// the log line.
func TestBadPluginConfig(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		needStack(t)
		ctx := context.Background()
		s := sharedEnvoys(t)[0]
		up, err := stack.StartUpstream("127.0.0.1:0", "")
		if err != nil {
			t.Fatal(err)
		}
		defer up.Close(ctx)
		// The good listener's filter has no control plane (port 1 refuses
		// connections) and fails open: each request through it counts a
		// failure_open, which shows the filter still runs.
		name := nextName()
		addr, err := s.configure(f, name, plugin().JSON(), "127.0.0.1:1", up.Addr())
		if err != nil {
			t.Fatal(err)
		}
		good := s.listener(f, name, plugin().JSON()) // as configure wrote it
		logFrom := len(s.Log())
		defer func() {
			if t.Failed() {
				t.Logf("envoy log (%s) during the test:\n%s", s.LogPath(), stack.LogExcerpt(s.Log()[logFrom:]))
			}
		}()
		through := func(when string) {
			t.Helper()
			before := s.Stat(f.Stat("sluice.failure_open"))
			r := sendTo("http://"+addr+"/", "someone")
			if r.err != nil || r.status != 200 {
				t.Fatalf("%s: the good listener answers %v status %d %q", when, r.err, r.status, r.body)
			}
			if after := s.Stat(f.Stat("sluice.failure_open")); after != before+1 {
				t.Fatalf("%s: the filter did not decide the request (failure_open %d -> %d)", when, before, after)
			}
		}
		through("before the updates")

		for _, tc := range badPlugins {
			t.Run(tc.name, func(t *testing.T) {
				rejected := s.Stat("listener_manager.lds.update_rejected")
				from := len(s.Log())
				// A plugin name of its own: Envoy remembers a plugin (name and
				// configuration) that failed, and refuses it again without
				// running proxy_on_configure, so without logging why.
				bad := filterListener(f, "bad", []byte(tc.config), "sluice-bad-"+nextName())
				if err := s.lds.Write(good, bad); err != nil {
					t.Fatal(err)
				}
				var logged string
				took, ok := waitFor(10*time.Second, func() bool {
					logged = s.Log()[from:]
					return strings.Contains(logged, "config rejected")
				})
				if !ok {
					t.Fatalf("Envoy did not reject the update within %v; lds updates: %d rejected, %d accepted; log:\n%s",
						took, s.Stat("listener_manager.lds.update_rejected"), s.Stat("listener_manager.lds.update_success"), logged)
				}
				if n := s.Stat("listener_manager.lds.update_rejected"); n != rejected+1 {
					t.Errorf("listener_manager.lds.update_rejected went from %d to %d", rejected, n)
				}
				line := lineWith(logged, "invalid plugin configuration")
				if line == "" {
					t.Fatalf("the filter's error is not in Envoy's log:\n%s", logged)
				}
				if !strings.Contains(line, tc.field) {
					t.Errorf("Envoy's log does not name %q:\n%s", tc.field, line)
				}
				if a, err := s.LookupListener("bad"); err != nil || a != "" {
					t.Errorf("listener bad: %q, %v; want none", a, err)
				}
				through("after the rejected update")
			})
		}
		// The good configuration, updated the same way, is accepted: the cases
		// above fail for the reason they name.
		success := s.Stat("listener_manager.lds.update_success")
		if err := s.lds.Write(good, filterListener(f, name+"-good", plugin().JSON(), "sluice-"+name+"-good")); err != nil {
			t.Fatal(err)
		}
		if took, ok := waitFor(10*time.Second, func() bool {
			return s.Stat("listener_manager.lds.update_success") > success
		}); !ok {
			t.Fatalf("Envoy did not accept a good listener within %v:\n%s", took, stack.LogExcerpt(s.Log()[logFrom:]))
		}

		// At start-up: Envoy exits, and the error names the field.
		tc := badPlugins[3]
		boot := stack.Bootstrap([]stack.M{filterListener(f, "bad", []byte(tc.config), "sluice")}, clusters("127.0.0.1:1", up.Addr()))
		bad, err := stack.StartEnvoy(ctx, envoyConfig(t.TempDir(), "bad-at-start", boot))
		if err == nil {
			bad.Stop()
			t.Fatalf("Envoy started with the plugin configuration %s", tc.config)
		}
		if line := lineWith(err.Error(), "invalid plugin configuration"); !strings.Contains(line, tc.field) {
			t.Errorf("StartEnvoy's error does not name %q:\n%v", tc.field, err)
		}
		t.Logf("at start-up: %v", lineWith(err.Error(), "invalid plugin configuration"))
	})
}

// lineWith returns the first line of s containing sub, or "".
func lineWith(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
