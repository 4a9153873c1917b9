package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFlagValues: values of sluice-controlplane's flags and their variables
// that parse but cannot work are refused, each error naming the flag and
// its variable; good values pass.
func TestFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" for a good value
	}{
		{[]string{"-near-limit-ratio", "NaN"}, "-near-limit-ratio ($SLUICE_NEAR_LIMIT_RATIO) NaN: not a finite number"},
		{[]string{"-near-limit-ratio", "Inf"}, "-near-limit-ratio"},
		{[]string{"-near-limit-ratio", "1.5"}, "-near-limit-ratio"},
		{[]string{"-degrade-failure-ratio", "NaN"}, "-degrade-failure-ratio"},
		{[]string{"-degrade-failure-ratio", "Inf"}, ""},
		{[]string{"-grpc-addr", "::::"}, "-grpc-addr ($SLUICE_GRPC_ADDR)"},
		{[]string{"-grpc-addr", "127.0.0.1:99999"}, "-grpc-addr"},
		{[]string{"-http-addr", "a b:80"}, "-http-addr"},
		{[]string{"-policy-addr", "127.0.0.1"}, "-policy-addr"},
		{[]string{"-rlqs-addr", ":-1"}, "-rlqs-addr"},
		{[]string{"-rlqs-addr", "[::1]:18081"}, ""},
		{[]string{"-redis-addrs", "::::"}, "-redis-addrs"},
		{[]string{"-redis-addrs", "r:6379,r2:0"}, "-redis-addrs"},
		{[]string{"-redis-addrs", "redis-0.redis:6379,10.0.0.2:6380"}, ""},
		{[]string{"-redis-db", "-1"}, "-redis-db"},
		{[]string{"-settle-dedupe-ttl", "2562047h"}, "-settle-dedupe-ttl"},
		{[]string{"-settle-dedupe-ttl", "1h"}, ""},
	} {
		_, err := parseFlags(tc.args, func(string) string { return "" }, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error holding %q", tc.args, err, tc.want)
		}
	}
	// The same through the environment names the variable too.
	_, err := parseFlags(nil, func(k string) string { return map[string]string{"SLUICE_NEAR_LIMIT_RATIO": "NaN"}[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "$SLUICE_NEAR_LIMIT_RATIO") {
		t.Errorf("$SLUICE_NEAR_LIMIT_RATIO=NaN: %v", err)
	}
}

// ratelimitBinary returns the built binary under the name ratelimit (as
// Envoy Gateway runs it).
func ratelimitBinary(t *testing.T) string {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	rl := filepath.Join(t.TempDir(), RatelimitName)
	if err := os.Symlink(bin, rl); err != nil {
		t.Fatal(err)
	}
	return rl
}

// TestBinaryRatelimitEnvRefused runs the built binary as ratelimit with
// values that cannot work: each start stops with exit status 2 and a
// message naming the variable, before any listener opens.
func TestBinaryRatelimitEnvRefused(t *testing.T) {
	rl := ratelimitBinary(t)
	rt := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rt, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rt, "config", "d.yaml"), []byte(binPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"PORT=0", "DEBUG_PORT=0", "GRPC_PORT=0", "HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "GRPC_HOST=127.0.0.1",
		"RUNTIME_ROOT=" + rt, "RUNTIME_SUBDIRECTORY=", "RUNTIME_WATCH_ROOT=false", "REDIS_SOCKET_TYPE=tcp", "SLUICE_POLICY_ADDR=127.0.0.1:0"}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"NEAR_LIMIT_RATIO=NaN"}, `$NEAR_LIMIT_RATIO="NaN"`},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR=NaN"}, `$XDS_CLIENT_BACKOFF_RANDOM_FACTOR="NaN"`},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:99999"}, `$CONFIG_GRPC_XDS_SERVER_URL="127.0.0.1:99999"`},
		{[]string{"HOST=::::"}, `$HOST="::::"`},
		{[]string{"REDIS_URL=::::"}, `$REDIS_URL=\"::::\"`},
		// A good value this host cannot listen on: the error names the
		// variables, not the listener's role alone.
		{[]string{"GRPC_HOST=192.0.2.1"}, `$GRPC_HOST, $GRPC_PORT (192.0.2.1:0)`},
	} {
		cmd := exec.Command(rl)
		cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH")}, base...), tc.env...)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%q: exit %d, output:\n%s\nwant exit 2 and %q", tc.env, code, out, tc.want)
		}
	}
}
