package policystore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lua scripts; each runs atomically in Redis. All keys they touch carry one
// hash tag, so they work on Redis Cluster too.
var (
	//go:embed lua/put.lua
	putLua string
	//go:embed lua/delete.lua
	deleteLua string
	//go:embed lua/load.lua
	loadLua string
	//go:embed lua/init.lua
	initLua string
	//go:embed lua/files.lua
	filesLua string

	putScript    = redis.NewScript(putLua)
	deleteScript = redis.NewScript(deleteLua)
	loadScript   = redis.NewScript(loadLua)
	initScript   = redis.NewScript(initLua)
	filesScript  = redis.NewScript(filesLua)
)

// DefaultNamespace is the hash tag of the policy keys unless
// RedisOptions.Namespace says otherwise.
const DefaultNamespace = "policies"

// resubscribeBackoff bounds the wait between two failed attempts to receive
// change notifications.
const (
	minResubscribe = 50 * time.Millisecond
	maxResubscribe = time.Second
	// pubsubIdle is how long the subscription may stay silent before it is
	// PINGed, so a connection that died without a word is noticed and
	// replaced.
	pubsubIdle = 5 * time.Second
)

// RedisOptions configures a Redis backend.
type RedisOptions struct {
	// Namespace separates several sluice deployments sharing one Redis: the
	// keys are "sluice:{<Namespace>}:..." (the braces make it the Redis
	// Cluster hash tag, so every policy key is in one slot). Default
	// DefaultNamespace.
	Namespace string
}

// Redis keeps policies in Redis:
//
//	sluice:{policies}:version          the store version (INCR on every change)
//	sluice:{policies}:domains          the set of domain names
//	sluice:{policies}:domain:<domain>  a hash: version, yaml, and for a domain
//	                                   a policy file owns, owner (the file) and
//	                                   source (its -policy path)
//	sluice:{policies}:sources          a hash: -policy path -> "stamp hash", the
//	                                   version of its files in force
//
// Every change is one Lua script, so the version guard is exact and a
// reader never sees half of a change, and publishes the new version on
// the channel sluice:{policies}:changes. The keys have no expiry: keep
// Redis's maxmemory-policy from evicting keys without one (noeviction or a
// volatile-* policy), or back it by persistence; a Store that finds the
// store lost writes back what it holds.
type Redis struct {
	client  redis.UniversalClient
	version string // the version counter's key
	domains string // the domain set's key
	sources string // the key of the sources' versions
	prefix  string // the prefix of each domain's key
	channel string // the change channel
}

// NewRedis returns a Redis backend using client, which the caller keeps
// owning (and closes).
func NewRedis(client redis.UniversalClient, opts RedisOptions) (*Redis, error) {
	if client == nil {
		return nil, errors.New("policystore: NewRedis: nil client")
	}
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if strings.ContainsAny(ns, "{}") || strings.IndexFunc(ns, isControl) >= 0 {
		return nil, fmt.Errorf("policystore: Redis namespace %q: must not contain '{', '}' or control characters", ns)
	}
	base := "sluice:{" + ns + "}:"
	return &Redis{
		client:  client,
		version: base + "version",
		domains: base + "domains",
		sources: base + "sources",
		prefix:  base + "domain:",
		channel: base + "changes",
	}, nil
}

// isControl reports whether r is a control character.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// Name returns "redis".
func (r *Redis) Name() string { return "redis" }

// Load reads every domain, the sources and the version in one script call.
func (r *Redis) Load(ctx context.Context) (State, error) {
	res, err := loadScript.Run(ctx, r.client, []string{r.version, r.domains, r.sources}, r.prefix).Slice()
	if err != nil {
		return State{}, unavailable("redis", err)
	}
	var st State
	var domains, sources []string
	var ver string
	ok := len(res) == 3
	if ok {
		ver, ok = res[0].(string)
	}
	if ok {
		domains, ok = stringList(res[1])
	}
	if ok {
		sources, ok = stringList(res[2])
	}
	if !ok || len(domains)%5 != 0 || len(sources)%2 != 0 {
		return State{}, fmt.Errorf("policystore: redis load: malformed reply %.200v", res)
	}
	if st.Version, err = strconv.ParseUint(ver, 10, 64); err != nil {
		return State{}, fmt.Errorf("policystore: redis key %s: not a version: %q", r.version, ver)
	}
	st.Records = make([]Record, 0, len(domains)/5)
	for i := 0; i < len(domains); i += 5 {
		v, err := strconv.ParseUint(domains[i+1], 10, 64)
		if err != nil {
			return State{}, fmt.Errorf("policystore: redis key %s%s: not a version: %q", r.prefix, domains[i], domains[i+1])
		}
		st.Records = append(st.Records, Record{Domain: domains[i], Version: v, YAML: []byte(domains[i+2]),
			Owner: domains[i+3], Source: domains[i+4]})
	}
	sort.Slice(st.Records, func(i, j int) bool { return st.Records[i].Domain < st.Records[j].Domain })
	for i := 0; i < len(sources); i += 2 {
		rec, err := parseOrder(sources[i], sources[i+1])
		if err != nil {
			return State{}, err
		}
		st.Sources = append(st.Sources, rec)
	}
	sort.Slice(st.Sources, func(i, j int) bool { return st.Sources[i].Path < st.Sources[j].Path })
	return st, nil
}

// stringList returns a script's array of strings (nil when empty), and
// whether v is one.
func stringList(v any) ([]string, bool) {
	a, ok := v.([]any)
	if !ok {
		return nil, false
	}
	var out []string
	for _, x := range a {
		s, ok := x.(string)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// Version reads the version counter; a missing counter is 0.
func (r *Redis) Version(ctx context.Context) (uint64, error) {
	s, err := r.client.Get(ctx, r.version).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("redis", err)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("policystore: redis key %s: not a version: %q", r.version, s)
	}
	return v, nil
}

// guardArg encodes a guard as the scripts' expected-version argument.
func guardArg(g Guard) string {
	if !g.Check {
		return ""
	}
	return strconv.FormatUint(g.Version, 10)
}

// scriptReply reads a {status, version[, owner]} script reply.
func scriptReply(res []any, err error) (int64, uint64, string, error) {
	if err != nil {
		return 0, 0, "", unavailable("redis", err)
	}
	var status, v int64
	var owner string
	ok := len(res) == 2 || len(res) == 3
	if ok {
		status, ok = res[0].(int64)
	}
	if ok {
		v, ok = res[1].(int64)
	}
	if ok && len(res) == 3 {
		owner, ok = res[2].(string)
	}
	if !ok || v < 0 {
		return 0, 0, "", fmt.Errorf("policystore: redis: malformed script reply %.200v", res)
	}
	return status, uint64(v), owner, nil
}

// takeOverArg encodes Guard.TakeOver for the scripts.
func takeOverArg(g Guard) string {
	if g.TakeOver {
		return "1"
	}
	return ""
}

// Put runs put.lua.
func (r *Redis) Put(ctx context.Context, domain string, yaml []byte, g Guard) (uint64, bool, error) {
	status, v, owner, err := scriptReply(putScript.Run(ctx, r.client,
		[]string{r.version, r.domains, r.prefix + domain},
		domain, yaml, guardArg(g), r.channel, takeOverArg(g)).Slice())
	if err != nil {
		return 0, false, err
	}
	switch status {
	case 1:
		return v, false, nil
	case 2:
		return v, true, nil
	case 0:
		return 0, false, &ConflictError{Domain: domain, Expected: g.Version, Actual: v}
	case -2:
		return 0, false, fmt.Errorf("redis: %w", ErrUninitialized)
	case -3:
		return 0, false, fileOwned(domain, owner)
	}
	return 0, false, fmt.Errorf("policystore: redis put: unexpected status %d", status)
}

// Delete runs delete.lua.
func (r *Redis) Delete(ctx context.Context, domain string, g Guard) (uint64, error) {
	status, v, owner, err := scriptReply(deleteScript.Run(ctx, r.client,
		[]string{r.version, r.domains, r.prefix + domain},
		domain, guardArg(g), r.channel, takeOverArg(g)).Slice())
	if err != nil {
		return 0, err
	}
	switch status {
	case 1:
		return v, nil
	case -1:
		return 0, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
	case 0:
		return 0, &ConflictError{Domain: domain, Expected: g.Version, Actual: v}
	case -3:
		return 0, fileOwned(domain, owner)
	}
	return 0, fmt.Errorf("policystore: redis delete: unexpected status %d", status)
}

// Init runs init.lua.
func (r *Redis) Init(ctx context.Context, st State) (bool, error) {
	if err := checkInitState(st); err != nil {
		return false, err
	}
	args := make([]any, 0, 4+2*len(st.Sources)+5*len(st.Records))
	args = append(args, r.prefix, r.channel, strconv.FormatUint(st.Version, 10), len(st.Sources))
	for _, src := range st.Sources {
		args = append(args, src.Path, src.order())
	}
	for _, rec := range st.Records {
		args = append(args, rec.Domain, strconv.FormatUint(rec.Version, 10), rec.YAML, rec.Owner, rec.Source)
	}
	n, err := initScript.Run(ctx, r.client, []string{r.version, r.domains, r.sources}, args...).Int64()
	if err != nil {
		return false, unavailable("redis", err)
	}
	return n == 1, nil
}

// PutSources runs files.lua.
func (r *Redis) PutSources(ctx context.Context, srcs []SourceState) ([]SourceResult, uint64, error) {
	args := []any{r.prefix, r.channel, len(srcs)}
	for _, src := range srcs {
		args = append(args, src.Path, src.order(), src.Hash, len(src.Records))
		for _, rec := range src.Records {
			args = append(args, rec.Domain, rec.Owner, rec.YAML)
		}
	}
	res, err := filesScript.Run(ctx, r.client, []string{r.version, r.domains, r.sources}, args...).Slice()
	if err != nil {
		return nil, 0, unavailable("redis", err)
	}
	if len(res) == 0 {
		return nil, 0, errors.New("policystore: redis files: empty reply")
	}
	if len(res) == 1 && res[0] == int64(-2) {
		return nil, 0, fmt.Errorf("redis: %w", ErrUninitialized)
	}
	v, ok := res[0].(int64)
	if !ok || v < 0 || len(res) != 1+len(srcs) {
		return nil, 0, fmt.Errorf("policystore: redis files: malformed reply %.200v", res)
	}
	out := make([]SourceResult, len(srcs))
	for i, src := range srcs {
		a, _ := res[1+i].([]any)
		var outcome int64
		var order string
		var lists [4][]string
		ok := len(a) == 6
		if ok {
			outcome, _ = a[0].(int64)
			order, _ = a[1].(string)
		}
		for j := range lists {
			if ok {
				lists[j], ok = stringList(a[2+j])
			}
		}
		rec, err := parseOrder(src.Path, order)
		if !ok || err != nil || (outcome != int64(InForce) && outcome != int64(Older)) {
			return nil, 0, fmt.Errorf("policystore: redis files: malformed reply %.200v", res)
		}
		out[i] = SourceResult{Path: src.Path, Outcome: Outcome(outcome), Record: rec,
			Changed: lists[0], Unchanged: lists[1], Deleted: lists[2], Kept: lists[3]}
		sort.Strings(out[i].Deleted)
	}
	return out, uint64(v), nil
}

// checkInitState checks what Init requires of a state.
func checkInitState(st State) error {
	if st.Version == 0 {
		return errors.New("policystore: Init: the state's version must be at least 1")
	}
	seen := make(map[string]bool, len(st.Records))
	for _, rec := range st.Records {
		if rec.Version == 0 || rec.Version > st.Version {
			return fmt.Errorf("policystore: Init: domain %q: version %d must be within 1..%d", rec.Domain, rec.Version, st.Version)
		}
		if seen[rec.Domain] {
			return fmt.Errorf("policystore: Init: domain %q twice", rec.Domain)
		}
		seen[rec.Domain] = true
	}
	return nil
}

// Subscribe listens on the change channel. Besides every published change,
// each (re)subscription sends a hint, since notifications may have been
// missed while the connection was down.
func (r *Redis) Subscribe(ctx context.Context) <-chan struct{} {
	hints := make(chan struct{}, 1)
	ps := r.client.Subscribe(ctx, r.channel)
	go func() {
		<-ctx.Done()
		ps.Close() // ends Receive below
	}()
	go func() {
		defer close(hints)
		backoff := minResubscribe
		for {
			msg, err := ps.ReceiveTimeout(ctx, pubsubIdle)
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Silence: a PING either answers (a Pong arrives) or
				// fails, and the connection is replaced.
				if err := ps.Ping(ctx); err == nil {
					continue
				}
			}
			if err != nil {
				if errors.Is(err, redis.ErrClosed) {
					return
				}
				// The connection failed; the next Receive reconnects and
				// subscribes again. Wait a little so a Redis that is down
				// is not dialled in a tight loop.
				t := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				backoff = min(2*backoff, maxResubscribe)
				continue
			}
			backoff = minResubscribe
			switch msg.(type) {
			case *redis.Message, *redis.Subscription:
				select {
				case hints <- struct{}{}:
				default: // a hint is already pending
				}
			}
		}
	}()
	return hints
}
