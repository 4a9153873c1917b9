package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
)

// versionFlag is an optional --expected-version.
type versionFlag struct {
	set bool
	v   uint64
}

// String returns the value.
func (f *versionFlag) String() string {
	if !f.set {
		return ""
	}
	return strconv.FormatUint(f.v, 10)
}

// Set parses the value.
func (f *versionFlag) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want a version number (0: the domain must not exist yet), got %q", s)
	}
	f.set, f.v = true, v
	return nil
}

// ptr returns the version for a request, nil when not set.
func (f *versionFlag) ptr() *uint64 {
	if !f.set {
		return nil
	}
	v := f.v
	return &v
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

// String joins the values.
func (f *stringsFlag) String() string { return strings.Join(*f, ",") }

// Set appends a value.
func (f *stringsFlag) Set(s string) error {
	*f = append(*f, s)
	return nil
}

// policyClient connects to the policy service and returns a client, the
// context carrying credentials and a deadline, and a cleanup.
func (e *env) policyClient(ctx context.Context, stream bool) (sluicev1.PolicyServiceClient, context.Context, func(), error) {
	conn, err := e.dial(e.g.server)
	if err != nil {
		return nil, nil, nil, err
	}
	cancel := func() {}
	if !stream {
		ctx, cancel = context.WithTimeout(ctx, e.g.timeout)
	}
	ctx, err = e.authContext(ctx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, nil, nil, err
	}
	return sluicev1.NewPolicyServiceClient(conn), ctx, func() { cancel(); conn.Close() }, nil
}

// unwrapPathErr drops the path of an *fs.PathError (the message names it).
func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// noFlags is the setup of a command without flags of its own.
func noFlags(r runner) func(*flag.FlagSet) runner {
	return func(*flag.FlagSet) runner { return r }
}

// --- get ---

var getCmd = &command{
	name:    "get",
	args:    "DOMAIN",
	summary: "print one domain's policy and version",
	setup: noFlags(func(ctx context.Context, e *env, args []string) error {
		if len(args) != 1 {
			return usagef("get: want one DOMAIN, got %d arguments", len(args))
		}
		client, ctx, done, err := e.policyClient(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		res, err := client.Get(ctx, &sluicev1.GetRequest{Domain: args[0]})
		if err != nil {
			return e.explain(err, e.policyTarget())
		}
		out := policyOut(res.GetPolicy())
		return e.print(getOutput{policyJSON: out, StoreVersion: res.GetStoreVersion()}, func(w io.Writer) {
			fmt.Fprintf(w, "# domain %s, version %d (store version %d), owner %s\n", out.Domain, out.Version, res.GetStoreVersion(), out.Owner)
			io.WriteString(w, out.YAML)
			if !strings.HasSuffix(out.YAML, "\n") {
				io.WriteString(w, "\n")
			}
		})
	}),
}

// policyJSON is a policy in json and yaml output. Owner is the policy
// file that owns the domain, "xds:<resource>", or "store".
type policyJSON struct {
	Domain  string `json:"domain" yaml:"domain"`
	Version uint64 `json:"version" yaml:"version"`
	Owner   string `json:"owner" yaml:"owner"`
	YAML    string `json:"yaml" yaml:"yaml"`
}

// getOutput is get's output.
type getOutput struct {
	policyJSON   `yaml:",inline"`
	StoreVersion uint64 `json:"store_version" yaml:"store_version"`
}

// policyOut converts a policy.
func policyOut(p *sluicev1.Policy) policyJSON {
	owner := p.GetOwner()
	if owner == "" {
		owner = "store"
	}
	return policyJSON{Domain: p.GetDomain(), Version: p.GetVersion(), Owner: owner, YAML: p.GetYaml()}
}

// --- list ---

var listCmd = &command{
	name:    "list",
	args:    "",
	summary: "list every domain in force with its version and owner (a policy file, xds:<resource>, or the store)",
	setup: noFlags(func(ctx context.Context, e *env, args []string) error {
		if len(args) != 0 {
			return usagef("list: takes no argument (got %q)", args[0])
		}
		client, ctx, done, err := e.policyClient(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		res, err := client.List(ctx, &sluicev1.ListRequest{})
		if err != nil {
			return e.explain(err, e.policyTarget())
		}
		out := listOutput{StoreVersion: res.GetStoreVersion(), Policies: []policyJSON{}}
		for _, p := range res.GetPolicies() {
			out.Policies = append(out.Policies, policyOut(p))
		}
		return e.print(out, func(w io.Writer) {
			if len(out.Policies) == 0 {
				fmt.Fprintf(w, "no domains (store version %d)\n", out.StoreVersion)
				return
			}
			width := len("DOMAIN")
			for _, p := range out.Policies {
				width = max(width, len(p.Domain))
			}
			fmt.Fprintf(w, "%-*s  %-7s  %s\n", width, "DOMAIN", "VERSION", "OWNER")
			for _, p := range out.Policies {
				fmt.Fprintf(w, "%-*s  %-7d  %s\n", width, p.Domain, p.Version, p.Owner)
			}
			fmt.Fprintf(w, "(store version %d)\n", out.StoreVersion)
		})
	}),
}

// listOutput is list's output.
type listOutput struct {
	StoreVersion uint64       `json:"store_version" yaml:"store_version"`
	Policies     []policyJSON `json:"policies" yaml:"policies"`
}

// --- delete ---

var deleteCmd = &command{
	name:    "delete",
	args:    "DOMAIN [--expected-version N] [--take-over]",
	summary: "delete one domain's policy",
	setup: func(fs *flag.FlagSet) runner {
		var expected versionFlag
		fs.Var(&expected, "expected-version", "delete only if the domain is at this `version`; see get")
		takeOver := fs.Bool("take-over", false, "delete a domain a policy file owns (for a file no control plane reads any more; one that reads it puts the domain back)")
		return func(ctx context.Context, e *env, args []string) error {
			return runDelete(ctx, e, args, expected, *takeOver)
		}
	},
}

func runDelete(ctx context.Context, e *env, args []string, expected versionFlag, takeOver bool) error {
	if len(args) != 1 {
		return usagef("delete: want one DOMAIN, got %d arguments", len(args))
	}
	client, ctx, done, err := e.policyClient(ctx, false)
	if err != nil {
		return err
	}
	defer done()
	res, err := client.Delete(ctx, &sluicev1.DeleteRequest{Domain: args[0], ExpectedVersion: expected.ptr(), TakeOver: takeOver})
	if err != nil {
		return e.explain(err, e.policyTarget())
	}
	out := deleteOutput{Domain: args[0], StoreVersion: res.GetStoreVersion()}
	return e.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "domain %q deleted (store version %d)\n", out.Domain, out.StoreVersion)
	})
}

// deleteOutput is delete's output.
type deleteOutput struct {
	Domain       string `json:"domain" yaml:"domain"`
	StoreVersion uint64 `json:"store_version" yaml:"store_version"`
}

// --- watch ---

var watchCmd = &command{
	name:    "watch",
	args:    "[--count N]",
	summary: "print the current policies, then every change as it happens (until interrupted)",
	setup: func(fs *flag.FlagSet) runner {
		count := fs.Int("count", 0, "stop after `N` messages (the first is the current state); 0: never")
		return func(ctx context.Context, e *env, args []string) error {
			return runWatch(ctx, e, args, *count)
		}
	},
}

// watchOutput is one watch message in json and yaml output.
type watchOutput struct {
	StoreVersion uint64       `json:"store_version" yaml:"store_version"`
	Snapshot     bool         `json:"snapshot" yaml:"snapshot"`
	Applied      []policyJSON `json:"applied" yaml:"applied"`
	Deleted      []string     `json:"deleted" yaml:"deleted"`
}

func runWatch(ctx context.Context, e *env, args []string, count int) error {
	if len(args) != 0 {
		return usagef("watch: takes no argument (got %q)", args[0])
	}
	if count < 0 {
		return usagef("watch: --count must be >= 0 (got %d)", count)
	}
	client, sctx, done, err := e.policyClient(ctx, true)
	if err != nil {
		return err
	}
	defer done()
	stream, err := client.Watch(sctx, &sluicev1.WatchRequest{})
	if err != nil {
		return e.explain(err, e.policyTarget())
	}
	for n := 0; count == 0 || n < count; n++ {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the policy service ended the watch")
			}
			return e.explain(err, e.policyTarget())
		}
		out := watchOutput{StoreVersion: msg.GetStoreVersion(), Snapshot: msg.GetSnapshot(),
			Applied: []policyJSON{}, Deleted: append([]string{}, msg.GetDeleted()...)}
		for _, p := range msg.GetApplied() {
			out.Applied = append(out.Applied, policyOut(p))
		}
		if err := e.printStreamed(n, out, func(w io.Writer) {
			var parts []string
			for _, p := range out.Applied {
				parts = append(parts, fmt.Sprintf("%s v%d", p.Domain, p.Version))
			}
			if out.Snapshot {
				if len(parts) == 0 {
					parts = []string{"no domains"}
				}
				fmt.Fprintf(w, "store version %d (current): %s\n", out.StoreVersion, strings.Join(parts, ", "))
				return
			}
			var change []string
			if len(parts) > 0 {
				change = append(change, "applied "+strings.Join(parts, ", "))
			}
			if len(out.Deleted) > 0 {
				change = append(change, "deleted "+strings.Join(out.Deleted, ", "))
			}
			if len(change) == 0 {
				change = []string{"no domain changed"}
			}
			fmt.Fprintf(w, "store version %d: %s\n", out.StoreVersion, strings.Join(change, "; "))
		}); err != nil {
			return err
		}
	}
	return nil
}

// --- check ---

var checkCmd = &command{
	name:    "check",
	args:    "DOMAIN key=value [key=value ...] [+ key=value ...] [--hits N]",
	summary: "ask the decision API about one request (ShouldRateLimit) and print the answer; + starts another descriptor. It consumes quota as a real request does: --hits 0 only looks",
	setup: func(fs *flag.FlagSet) runner {
		hits := fs.Uint64("hits", 1, "hits_addend: how much the request costs (`N`; 0: only look)")
		return func(ctx context.Context, e *env, args []string) error {
			return runCheck(ctx, e, args, *hits)
		}
	},
}

// checkOutput is check's output in json and yaml.
type checkOutput struct {
	Domain      string            `json:"domain" yaml:"domain"`
	OverallCode string            `json:"overall_code" yaml:"overall_code"`
	Statuses    []checkStatus     `json:"statuses" yaml:"statuses"`
	Headers     map[string]string `json:"response_headers,omitempty" yaml:"response_headers,omitempty"`
}

// checkStatus is one descriptor's answer.
type checkStatus struct {
	Descriptor      string `json:"descriptor" yaml:"descriptor"`
	Code            string `json:"code" yaml:"code"`
	Limit           string `json:"limit,omitempty" yaml:"limit,omitempty"`
	LimitName       string `json:"limit_name,omitempty" yaml:"limit_name,omitempty"`
	Remaining       uint32 `json:"remaining" yaml:"remaining"`
	ResetAfterMilli int64  `json:"reset_after_ms" yaml:"reset_after_ms"`
}

// parseDescriptors reads "key=value ... + key=value ..." arguments.
func parseDescriptors(args []string) ([]*ratelimitv3.RateLimitDescriptor, error) {
	var out []*ratelimitv3.RateLimitDescriptor
	cur := &ratelimitv3.RateLimitDescriptor{}
	for _, a := range args {
		if a == "+" {
			if len(cur.Entries) == 0 {
				return nil, usagef("check: a + separates descriptors: put key=value entries on both sides")
			}
			out = append(out, cur)
			cur = &ratelimitv3.RateLimitDescriptor{}
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, usagef("check: %q is not key=value (e.g. remote_address=10.0.0.1)", a)
		}
		cur.Entries = append(cur.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	if len(cur.Entries) == 0 {
		return nil, usagef("check: no descriptor: give key=value entries after the domain, e.g. ratectl check api remote_address=10.0.0.1")
	}
	return append(out, cur), nil
}

// describeDescriptor writes a descriptor as key=value, key=value.
func describeDescriptor(d *ratelimitv3.RateLimitDescriptor) string {
	parts := make([]string, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ", ")
}

func runCheck(ctx context.Context, e *env, args []string, hits uint64) error {
	if len(args) < 2 {
		return usagef("check: want DOMAIN and at least one key=value entry, e.g. ratectl check api remote_address=10.0.0.1")
	}
	if hits > math.MaxUint32 {
		return usagef("check: --hits must be at most %d", uint32(math.MaxUint32))
	}
	descs, err := parseDescriptors(args[1:])
	if err != nil {
		return err
	}
	conn, err := e.dial(e.g.rlsServer)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, e.g.timeout)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: args[0], Descriptors: descs, HitsAddend: uint32(hits)}
	if hits == 0 {
		// hits_addend 0 means 1 on the request; a descriptor's own 0 peeks.
		for _, d := range descs {
			d.HitsAddend = wrapperspb.UInt64(0)
		}
	}
	res, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return e.explain(err, e.rlsTarget())
	}
	out := checkOutput{Domain: args[0], OverallCode: res.GetOverallCode().String(), Statuses: []checkStatus{}}
	for i, st := range res.GetStatuses() {
		cs := checkStatus{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining(),
			ResetAfterMilli: st.GetDurationUntilReset().AsDuration().Milliseconds()}
		if i < len(descs) {
			cs.Descriptor = describeDescriptor(descs[i])
		}
		if l := st.GetCurrentLimit(); l != nil {
			cs.Limit = describeLimit(l)
			cs.LimitName = l.GetName()
		}
		out.Statuses = append(out.Statuses, cs)
	}
	for _, h := range res.GetResponseHeadersToAdd() {
		if out.Headers == nil {
			out.Headers = map[string]string{}
		}
		out.Headers[h.GetKey()] = h.GetValue()
	}
	return e.print(out, func(w io.Writer) {
		fmt.Fprintf(w, "%s  domain %s\n", out.OverallCode, out.Domain)
		for i, s := range out.Statuses {
			fmt.Fprintf(w, "  [%d] %s: %s", i+1, s.Descriptor, s.Code)
			if s.Limit == "" {
				fmt.Fprintln(w, "  (no limit applies)")
				continue
			}
			fmt.Fprintf(w, "  limit %s", s.Limit)
			if s.LimitName != "" {
				fmt.Fprintf(w, " (%s)", s.LimitName)
			}
			fmt.Fprintf(w, "  remaining %d  reset in %s\n", s.Remaining, formatMillis(s.ResetAfterMilli))
		}
		if hits > 0 {
			fmt.Fprintf(w, "  (this check consumed %d hit(s) of the quota, as a request would; --hits 0 only looks)\n", hits)
		}
		if len(out.Headers) > 0 {
			keys := make([]string, 0, len(out.Headers))
			for k := range out.Headers {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintln(w, "  response headers:")
			for _, k := range keys {
				fmt.Fprintf(w, "    %s: %s\n", k, out.Headers[k])
			}
		}
	})
}

// describeLimit writes a limit as "10/minute" or "10 per 30 seconds".
func describeLimit(l *rlsv3.RateLimitResponse_RateLimit) string {
	unit := strings.ToLower(l.GetUnit().String())
	if mult := l.GetUnitMultiplier().GetValue(); mult > 1 {
		return fmt.Sprintf("%d per %d %ss", l.GetRequestsPerUnit(), mult, unit)
	}
	return fmt.Sprintf("%d/%s", l.GetRequestsPerUnit(), unit)
}

// formatMillis writes a duration in milliseconds readably ("725ms", "1h0m0s").
func formatMillis(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}
