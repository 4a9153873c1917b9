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

	putScript    = redis.NewScript(putLua)
	deleteScript = redis.NewScript(deleteLua)
	loadScript   = redis.NewScript(loadLua)
	initScript   = redis.NewScript(initLua)
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
//	sluice:{policies}:domain:<domain>  a hash: version, yaml
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
		prefix:  base + "domain:",
		channel: base + "changes",
	}, nil
}

// isControl reports whether r is a control character.
func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// Name returns "redis".
func (r *Redis) Name() string { return "redis" }

// Load reads every domain and the version in one script call.
func (r *Redis) Load(ctx context.Context) (State, error) {
	res, err := loadScript.Run(ctx, r.client, []string{r.version, r.domains}, r.prefix).StringSlice()
	if err != nil {
		return State{}, unavailable("redis", err)
	}
	if len(res) == 0 || (len(res)-1)%3 != 0 {
		return State{}, fmt.Errorf("policystore: redis load: malformed reply of %d items", len(res))
	}
	var st State
	if st.Version, err = strconv.ParseUint(res[0], 10, 64); err != nil {
		return State{}, fmt.Errorf("policystore: redis key %s: not a version: %q", r.version, res[0])
	}
	st.Records = make([]Record, 0, (len(res)-1)/3)
	for i := 1; i < len(res); i += 3 {
		v, err := strconv.ParseUint(res[i+1], 10, 64)
		if err != nil {
			return State{}, fmt.Errorf("policystore: redis key %s%s: not a version: %q", r.prefix, res[i], res[i+1])
		}
		st.Records = append(st.Records, Record{Domain: res[i], Version: v, YAML: []byte(res[i+2])})
	}
	sort.Slice(st.Records, func(i, j int) bool { return st.Records[i].Domain < st.Records[j].Domain })
	return st, nil
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

// scriptReply reads a {status, version} script reply.
func scriptReply(res []int64, err error) (int64, uint64, error) {
	if err != nil {
		return 0, 0, unavailable("redis", err)
	}
	if len(res) != 2 || res[1] < 0 {
		return 0, 0, fmt.Errorf("policystore: redis: malformed script reply %v", res)
	}
	return res[0], uint64(res[1]), nil
}

// Put runs put.lua.
func (r *Redis) Put(ctx context.Context, domain string, yaml []byte, g Guard) (uint64, bool, error) {
	status, v, err := scriptReply(putScript.Run(ctx, r.client,
		[]string{r.version, r.domains, r.prefix + domain},
		domain, yaml, guardArg(g), r.channel).Int64Slice())
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
	}
	return 0, false, fmt.Errorf("policystore: redis put: unexpected status %d", status)
}

// Delete runs delete.lua.
func (r *Redis) Delete(ctx context.Context, domain string, g Guard) (uint64, error) {
	status, v, err := scriptReply(deleteScript.Run(ctx, r.client,
		[]string{r.version, r.domains, r.prefix + domain},
		domain, guardArg(g), r.channel).Int64Slice())
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
	}
	return 0, fmt.Errorf("policystore: redis delete: unexpected status %d", status)
}

// Init runs init.lua.
func (r *Redis) Init(ctx context.Context, st State) (bool, error) {
	if err := checkInitState(st); err != nil {
		return false, err
	}
	args := make([]any, 0, 3+3*len(st.Records))
	args = append(args, r.prefix, r.channel, strconv.FormatUint(st.Version, 10))
	for _, rec := range st.Records {
		args = append(args, rec.Domain, strconv.FormatUint(rec.Version, 10), rec.YAML)
	}
	n, err := initScript.Run(ctx, r.client, []string{r.version, r.domains}, args...).Int64()
	if err != nil {
		return false, unavailable("redis", err)
	}
	return n == 1, nil
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
