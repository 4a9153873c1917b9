package server

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/controlplane/internal/rls"
	"github.com/sluicehq/sluice/controlplane/store/memory"
	"github.com/sluicehq/sluice/internal/attackload"
	"github.com/sluicehq/sluice/internal/redistest"
)

// onceMarkBytes bounds what Redis keeps for one settlement token
// (redisstore's OnceMarkBytes, measured with INFO memory there).
const onceMarkBytes = 150

// dialFrom returns a client of addr whose connections leave from the
// loopback address local (127.0.0.2: another client than the tests'
// 127.0.0.1, as far as the server can tell).
func dialFrom(t *testing.T, addr, local string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// settleCall sends one settlement of users (one charge of 1 each) under
// token.
func settleCall(c rlsv3.RateLimitServiceClient, token string, users ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, rls.SettleHeader, token)
	req := &rlsv3.RateLimitRequest{Domain: "srv"}
	for _, u := range users {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}, HitsAddend: wrapperspb.UInt64(1)})
	}
	_, err := c.ShouldRateLimit(ctx, req)
	return err
}

// TestSettleTokenFloodRedis: a client without credentials floods
// settlements, each with a new token and 16 charges (16 tokens), from
// 127.0.0.2; it once wrote 1.82 million dedupe keys (311 MB) in 30 s.
// With a budget of 20,000 tokens, Redis's used_memory grows by at most
// what the budget costs (onceMarkBytes a token) plus the few keys of the
// limits, the flood is refused with RESOURCE_EXHAUSTED once it holds half
// the budget, and >= 99.9% of another client's decisions and settlements
// (each with a new token, within its share) succeed meanwhile; so does a
// retry of an honest settlement, which the store recognizes.
func TestSettleTokenFloodRedis(t *testing.T) {
	for _, kind := range DecisionServers {
		t.Run(kind, func(t *testing.T) {
			const budget = 20_000
			SetRedisLogger(quiet)
			rs := redistest.StartServer(t)
			probe := redis.NewClient(&redis.Options{Addr: rs.Addr()})
			t.Cleanup(func() { probe.Close() })
			used := func() int64 {
				v, err := probe.InfoMap(context.Background(), "memory").Result()
				if err != nil {
					t.Fatal(err)
				}
				n, _ := strconv.ParseInt(v["Memory"]["used_memory"], 10, 64)
				return n
			}
			srv := start(t, Config{Policies: policies(t), GRPCServer: kind, Redis: RedisConfig{Addrs: []string{rs.Addr()}},
				SettleMaxTokens: budget, Deadline: 5 * time.Second})
			honest := rlsv3.NewRateLimitServiceClient(dial(t, srv.GRPCAddr()))
			if err := settleCall(honest, "warm-up", "warm"); err != nil {
				t.Fatal(err)
			}
			before := used()

			flood := rlsv3.NewRateLimitServiceClient(dialFrom(t, srv.GRPCAddr(), "127.0.0.2"))
			users := make([]string, 16)
			for i := range users {
				users[i] = "flood-" + strconv.Itoa(i)
			}
			var sent, refused atomic.Int64
			var peak atomic.Int64
			done := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						default:
						}
						err := settleCall(flood, fmt.Sprintf("f%d-%d", w, i), users...)
						sent.Add(1)
						if status.Code(err) == codes.ResourceExhausted {
							refused.Add(1)
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // Redis's memory, every 100 ms
				defer wg.Done()
				for {
					peak.Store(max(peak.Load(), used()))
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
			var decisions, settlements attackload.Tally
			var n atomic.Int64
			go func() { time.Sleep(3 * time.Second); close(done) }()
			attackload.During(done,
				attackload.Load{Workers: 2, Call: func() error {
					_, err := honest.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "srv",
						Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "normal"}}}}})
					return err
				}, Tally: &decisions},
				attackload.Load{Workers: 2, Call: func() error {
					i := n.Add(1)
					return settleCall(honest, "h-"+strconv.FormatInt(i, 10), "honest-"+strconv.FormatInt(i%50, 10))
				}, Tally: &settlements})
			wg.Wait()
			peak.Store(max(peak.Load(), used()))

			grew := peak.Load() - before
			bound := int64(budget*onceMarkBytes + 1<<20) // the tokens, and the limits' keys with room
			t.Logf("flood: %d settlements of 16 charges sent, %d refused; Redis used_memory grew %.1f MB at most (bound %.1f MB)",
				sent.Load(), refused.Load(), float64(grew)/(1<<20), float64(bound)/(1<<20))
			if grew > bound {
				t.Errorf("Redis used_memory grew %d bytes, more than the %d the budget allows", grew, bound)
			}
			if refused.Load() == 0 {
				t.Error("the flood was never refused")
			}
			decisions.Check(t, "decisions of another client", 0.999, 20)
			settlements.Check(t, "settlements of another client", 0.999, 20)
			// A retry of an honest settlement is a duplicate: charged once.
			if err := settleCall(honest, "h-1", "honest-1"); err != nil {
				t.Errorf("a retry of an honest settlement: %v", err)
			}
			_, m := get(t, "http://"+srv.HTTPAddr()+"/metrics")
			for _, want := range []string{`sluice_settle_tokens_refused_total{reason="share"}`, "sluice_settle_tokens ", `sluice_settlements_total{result="duplicate"} 1`} {
				if !strings.Contains(m, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}

// TestSettleTokensBound: without Redis the budget is at most what the
// memory store remembers, so that it never drops a token to make room.
func TestSettleTokensBound(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		redis bool
		want  int64
	}{
		{Config{}, false, memory.DefaultMaxOnce},
		{Config{SettleMaxTokens: 5000}, false, 5000},
		{Config{SettleMaxTokens: 1 << 40}, false, memory.DefaultMaxOnce},
		{Config{}, true, 0}, // rls.DefaultSettleTokens
		{Config{SettleMaxTokens: 1 << 40}, true, 1 << 40},
	} {
		s := &Server{cfg: tc.cfg}
		if tc.redis {
			s.client = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		}
		if got := s.settleTokens(); got != tc.want {
			t.Errorf("%+v, Redis %v: %d, want %d", tc.cfg.SettleMaxTokens, tc.redis, got, tc.want)
		}
	}
}
