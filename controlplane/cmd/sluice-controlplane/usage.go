package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// summary is the first line of -h: what the program is.
const summary = "sluice-controlplane decides Envoy's rate limits (RLS v3 ShouldRateLimit) from policies, on Redis or in memory."

// example is the usage example -h shows under the summary.
const example = `  sluice-controlplane -redis-addrs 127.0.0.1:6379 -policy policies/ -policy-watch 10s
  SLUICE_TOKEN=secret sluice-controlplane -policy api.yaml     # with the policy service on for ratectl`

// flagGroups sorts the flags by topic for -h and for docs/controlplane.md,
// in the order they are shown. Every flag must be in exactly one group
// (TestFlagGroups); a name no flag has is skipped, so that the table may
// name a flag before it exists.
var flagGroups = []struct {
	name  string
	flags []string
}{
	{"General", []string{"version", "log-level", "log-format", "shutdown-timeout", "gc-percent", "pprof"}},
	{"Decision port (RLS)", []string{"grpc-addr", "grpc-server", "grpc-tls-cert", "grpc-tls-key", "grpc-client-ca", "grpc-client-san",
		"max-descriptors", "near-limit-ratio", "rule-metric-values", "settle-dedupe-ttl", "settle-max-tokens"}},
	{"Connection bounds", []string{"max-conns", "max-streams-per-conn", "max-conn-buffer-bytes", "max-buffer-bytes", "max-msg-bytes", "idle-timeout",
		"first-call-timeout", "request-body-timeout"}},
	{"HTTP (metrics and health)", []string{"http-addr"}},
	{"Redis", []string{"redis-mode", "redis-addrs", "redis-master", "redis-db", "redis-username", "redis-password-file", "redis-no-functions"}},
	{"Redis TLS", []string{"redis-tls", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "redis-tls-server-name"}},
	{"Redis failures and the memory store", []string{"deadline", "probe-interval", "degrade-after-failures", "degrade-failure-ratio",
		"degrade-failure-window", "memory-max-entries", "memory-max-bytes"}},
	{"Policies", []string{"policy", "policy-seed-only", "policy-watch", "policy-file"}},
	{"envoyproxy/ratelimit behaviour", []string{"charge-past-limit", "quota-mode", "response-dynamic-metadata"}},
	{"Policy service (ratectl)", []string{"policy-addr", "policy-token-file", "policy-tls-cert", "policy-tls-key", "policy-client-ca"}},
	{"Rate Limit Quota Service (RLQS)", []string{"rlqs-addr", "rlqs-ttl", "rlqs-max-buckets", "rlqs-max-bucket-bytes"}},
}

// envOnly are the settings that are environment variables only: secrets,
// kept out of the process list.
var envOnly = [][2]string{
	{"SLUICE_REDIS_PASSWORD", "the Redis password (or -redis-password-file)"},
	{"SLUICE_TOKEN", "one bearer token the policy service accepts (or -policy-token-file)"},
}

// printUsage writes -h: the summary, an example, then the flags by group.
// Flags missing from flagGroups are listed last under "Other".
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "%s\n\nUsage: sluice-controlplane [flags]\n\nExample:\n%s\n\n", summary, example)
	fmt.Fprintln(w, "Every flag can also be set by the environment variable shown with it; a flag wins over its variable.")
	fmt.Fprintln(w, "Reference: docs/controlplane.md.")
	shown := map[string]bool{}
	for _, g := range flagGroups {
		var fl []*flag.Flag
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil {
				fl = append(fl, f)
				shown[name] = true
			}
		}
		printGroup(w, g.name, fl)
	}
	var rest []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !shown[f.Name] {
			rest = append(rest, f)
		}
	})
	printGroup(w, "Other", rest)
	fmt.Fprintln(w, "\nEnvironment only:")
	for _, e := range envOnly {
		fmt.Fprintf(w, "  $%s\n    \t%s\n", e[0], e[1])
	}
}

// printGroup writes one group's flags as the flag package would.
func printGroup(w io.Writer, name string, fl []*flag.Flag) {
	if len(fl) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s:\n", name)
	for _, f := range fl {
		typ, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	}
}

// parseArgs parses args with fs. -h prints the grouped usage to w and
// returns flag.ErrHelp; a bad flag returns one line naming it, with the
// nearest flag name when one is close, instead of the whole usage.
func parseArgs(fs *flag.FlagSet, args []string, w io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		printUsage(w, fs)
		return err
	}
	msg := err.Error()
	const undefined = "flag provided but not defined: -"
	if name, ok := strings.CutPrefix(msg, undefined); ok {
		msg = "unknown flag -" + name
		if near := nearestFlag(fs, name); near != "" {
			msg += fmt.Sprintf(": did you mean -%s?", near)
		}
	}
	return fmt.Errorf("%s (sluice-controlplane -h lists the flags)", msg)
}

// nearestFlag returns the defined flag name closest to name, if it is at
// most two edits away (or a prefix of it), else "".
func nearestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 4 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
