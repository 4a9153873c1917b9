package redisstore

import (
	"context"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkDecide measures decisions per second through Decide with many
// concurrent callers (32 goroutines per GOMAXPROCS) against a real
// redis-server, one check per call on 1,000 keys. It reports the scripts'
// time per decision from INFO commandstats (redis-us/decision: usec of
// EVALSHA over the decisions), the whole server's CPU time per decision from
// INFO cpu (redis-cpu-us/decision: also network and parsing), this process's
// CPU time per decision (go-cpu-us/decision: the callers, the store and
// go-redis), and how many decisions one script call carried.
func BenchmarkDecide(b *testing.B) {
	srv := redistest.StartServer(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 128})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	const keys = 1000
	for _, alg := range algs {
		for _, inFlight := range []int{1, 2, 4, 8} {
			if inFlight != DefaultMaxInFlight && alg != algorithms.KindFixedWindow {
				continue
			}
			b.Run(alg.String()+"/inflight="+strconv.Itoa(inFlight), func(b *testing.B) {
				s := newStore(b, client, Options{MaxInFlight: inFlight})
				l := store.Limit{Algorithm: alg, Requests: 1_000_000, Window: time.Minute}
				names := make([]string, keys)
				for i := range names {
					names[i] = store.Key("bench", []store.Entry{{Key: "k", Value: strconv.Itoa(i)}}, "l", alg)
				}
				if err := client.ScriptLoad(ctx, scriptSource).Err(); err != nil {
					b.Fatal(err)
				}
				if err := client.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				cpuBefore := redisCPU(b, client)
				selfBefore := processCPU(b)
				b.SetParallelism(32)
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					rng := rand.New(rand.NewSource(time.Now().UnixNano()))
					check := []store.Check{{Limit: l, Cost: 1}}
					out := make([]algorithms.Result, 1)
					for pb.Next() {
						check[0].Key = names[rng.Intn(keys)]
						if err := s.Decide(ctx, check, out); err != nil {
							b.Error(err)
							return
						}
					}
				})
				elapsed := time.Since(start)
				self := processCPU(b) - selfBefore
				b.StopTimer()
				cpu := redisCPU(b, client) - cpuBefore
				calls, usec := commandStats(b, client)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
				b.ReportMetric(float64(usec)/float64(b.N), "redis-us/decision")
				b.ReportMetric(cpu.Seconds()*1e6/float64(b.N), "redis-cpu-us/decision")
				b.ReportMetric(self.Seconds()*1e6/float64(b.N), "go-cpu-us/decision")
				if calls > 0 {
					b.ReportMetric(float64(b.N)/float64(calls), "decisions/call")
				}
			})
		}
	}
}

// BenchmarkScriptPerCheck measures the Redis CPU time of one check's Lua
// work alone, without the fixed cost of a script call: one EVAL runs an
// algorithm 1,000 times on 100 keys (ten calls per key, at consecutive
// microseconds, all allowed). It reports the script's usec per check from
// INFO commandstats.
func BenchmarkScriptPerCheck(b *testing.B) {
	srv := redistest.StartServer(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	base := preludeLua + fixedWindowLua + slidingWindowLua + slidingLogLua + tokenBucketLua + gcraLua + reserveLua
	calls := map[algorithms.Kind]string{
		algorithms.KindFixedWindow:   "fixed_window(k, now + i, 1000000, 60000000, 0, 1, '1')",
		algorithms.KindSlidingWindow: "sliding_window(k, now + i, 1000000, 60000000, 0, 1, '1')",
		algorithms.KindSlidingLog:    "sliding_log(k, now + i, 1000000, 60000000, 0, 1, '1')",
		algorithms.KindTokenBucket:   "token_bucket(k, now + i, 1000000, 60000000, 1000000, 1, '1')",
		algorithms.KindGCRA:          "gcra(k, now + i, 999999, 1000000, 60000000, 1, '1')",
		algorithms.KindReserve:       "reserve(k, now + i, 1000000, 60000000, 1000000, 1, '1', 0)",
	}
	for _, alg := range algs {
		b.Run(alg.String(), func(b *testing.B) {
			const perEval = 1000
			// dispatch.lua binds the library functions; this loop stands in
			// for it.
			src := base + "floor, fmt, match, tonumber, call, rpcall = bind()\nlocal now = tonumber(ARGV[1])\nfor i = 1, " + strconv.Itoa(perEval) +
				" do local k = 'k' .. (i % 100); " + calls[alg] + " end\nreturn 1"
			if err := client.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := client.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			now := int64(1_700_000_000_000_000)
			b.ResetTimer()
			for range (b.N + perEval - 1) / perEval {
				if err := client.Eval(ctx, src, nil, now).Err(); err != nil {
					b.Fatal(err)
				}
				now += perEval
			}
			b.StopTimer()
			evals, usec := commandStats(b, client)
			b.ReportMetric(float64(usec)/float64(evals*perEval), "redis-us/check")
		})
	}
}

// redisCPU returns the server's CPU time so far (user and system, main
// thread) from INFO cpu.
func redisCPU(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sec float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			sec += f
		}
	}
	return time.Duration(sec * float64(time.Second))
}
