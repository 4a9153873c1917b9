package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/stack"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestLeaseAcrossWorkers: one Envoy at --concurrency 4 (four Wasm VMs
// sharing one lease pool per descriptor through proxy-wasm shared data), a
// control plane on Redis with `lease: auto`, 64 callers on their own
// connections (the kernel spreads them over the workers), one key per
// leasable algorithm at half its limit for 3 s then three times it for
// 3 s. The units of a lease are spent once whichever VM spends them: no
// aligned window admits more than the algorithm allows, counted at the
// upstream; every 200 was decided by a call or from a lease. It logs the
// share of the allowed requests below the limit decided in the filter.
func TestLeaseAcrossWorkers(t *testing.T) {
	stack.ForEachFilter(t, filters, func(t *testing.T, f stack.Filter) {
		needStack(t)
		const concurrency = 4
		rs := redistest.StartServer(t)
		dir := t.TempDir()
		policyFile := writeLeasePolicy(t, dir)
		cp, err := stack.StartControlPlane(context.Background(), stack.ControlPlaneConfig{
			Binary: progs.ControlPlane, Dir: dir, RedisAddr: rs.Addr(), Policies: []string{policyFile},
			Args: []string{"-deadline", cpDeadline},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cp.Stop()
			if t.Failed() {
				t.Logf("control plane log:\n%s", logTail(cp.LogPath(), 30))
			}
		})
		up := startWindowUpstream(t)
		cfg := envoyConfig(dir, "lease-workers", stack.Bootstrap(
			[]stack.M{stack.HTTPListener("in", 0, []stack.M{stack.VirtualHost("all", stack.RouteTo("/", "up"))},
				f.HTTPFilter("sluice", plugin().JSON()))},
			[]stack.M{stack.Cluster("up", up.ln.Addr().String()), stack.GRPCCluster(stack.DefaultCluster, cp.GRPCAddr())}))
		cfg.Concurrency = concurrency
		e, err := stack.StartEnvoy(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Stop() })
		url := e.URL("in") + "/"
		if r := sendWith(http.DefaultClient, url, "warm-up"); r.err != nil || r.status != 200 {
			t.Fatalf("warm-up: %v %d", r.err, r.status)
		}
		base, err := e.Stats()
		if err != nil {
			t.Fatal(err)
		}

		const callers, perKey = 64, 16
		const steady, over = 3 * time.Second, 3 * time.Second
		start := time.Now().Truncate(time.Second).Add(time.Second) // on a window boundary
		overAt := start.Add(steady)
		end := overAt.Add(over)
		var ok, limited atomic.Int64
		var failed atomic.Value
		// below the limit: from a cold start (base) and steady (from the end
		// of the first second, warm)
		var cold, steadyL leaseSteady
		var warm map[string]int64
		var perSecond string // from leases / by a call, each second
		var wg sync.WaitGroup
		wg.Go(func() {
			last := base
			for at := start.Add(time.Second); !at.After(end); at = at.Add(time.Second) {
				time.Sleep(time.Until(at))
				s, err := e.Stats()
				if err != nil {
					failed.CompareAndSwap(nil, err.Error())
					return
				}
				q := s[f.Stat("sluice.quota_allowed")] - last[f.Stat("sluice.quota_allowed")]
				c := s[f.Stat("sluice.allowed")] - last[f.Stat("sluice.allowed")]
				perSecond += fmt.Sprintf(" %d/%d", q, c)
				last = s
				if at.Equal(start.Add(time.Second)) {
					warm = s
				}
				if at.Equal(overAt) {
					cold.add(f, []map[string]int64{s}, []map[string]int64{base})
					steadyL.add(f, []map[string]int64{s}, []map[string]int64{warm})
				}
			}
		})
		for i := range callers {
			k := leaseKeys[i%len(leaseKeys)]
			slot := i / len(leaseKeys)
			wg.Go(func() {
				client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
				defer client.CloseIdleConnections()
				at := start.Add(time.Duration(slot) * time.Second / perKey / (leaseLimit / 2))
				for {
					now := time.Now()
					if now.After(end) {
						return
					}
					if d := at.Sub(now); d > 0 {
						time.Sleep(d)
					}
					rate := float64(leaseLimit) / 2
					if !at.Before(overAt) {
						rate = 3 * leaseLimit
					}
					at = at.Add(time.Duration(float64(time.Second) * perKey / rate))
					status, err := sendSent(client, url, k.key)
					switch {
					case err != nil || (status != 200 && status != 429):
						failed.CompareAndSwap(nil, fmt.Sprintf("%v %d", err, status))
						return
					case status == 200:
						ok.Add(1)
					default:
						limited.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if f := failed.Load(); f != nil {
			t.Fatal(f)
		}
		s, err := e.Stats()
		if err != nil {
			t.Fatal(err)
		}
		stat := func(n string) int64 { return s[f.Stat("sluice."+n)] - base[f.Stat("sluice."+n)] }
		quota, called, failOpen := stat("quota_allowed"), stat("allowed"), stat("failure_open")
		if ok.Load() != quota+called+failOpen {
			t.Errorf("%d answered 200, but %d were admitted from leases and %d by a call (%d failed open)", ok.Load(), quota, called, failOpen)
		}
		for _, k := range leaseKeys {
			up.mu.Lock()
			counts := up.n[k.key]
			up.mu.Unlock()
			var line string
			for sec := start.Unix(); sec < end.Unix(); sec++ {
				got := counts[sec]
				line += fmt.Sprintf(" %d", got)
				if got > k.most {
					t.Errorf("%s: the second from %d admitted %d, more than %d", k.alg, sec-start.Unix(), got, k.most)
				}
			}
			t.Logf("%s: admitted per second:%s; %d admissions straddled two seconds", k.alg, line, up.straddled[k.key])
		}
		m, err := stack.Scrape(cp.HTTPURL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("control plane: %v lease calls to Redis, %v units shared with the filter, %v expired, %v held; "+
			"allowed from leases / by a call, each second:%s", m.Sum("sluice_lease_calls_total"), m.Sum("sluice_lease_shared_units_total"),
			m.Sum("sluice_lease_expired_units_total"), m.Sum("sluice_lease_outstanding_units"), perSecond)
		pct := func(a, b int64) float64 { return 100 * float64(a) / float64(max(a+b, 1)) }
		t.Logf("--concurrency %d: %d x 200, %d x 429; allowed below the limit from leases / by a call: steady (seconds 1-2) %d/%d (%.1f%% in the filter), "+
			"from a cold start (seconds 0-2) %d/%d (%.1f%%); overall %d/%d; lease CAS retries %d, exhausted %d, lost %d, waited for a call %d; failed open %d",
			concurrency, ok.Load(), limited.Load(), steadyL.quota, steadyL.called, pct(steadyL.quota, steadyL.called),
			cold.quota, cold.called, pct(cold.quota, cold.called), quota, called,
			stat("lease_cas_retries"), stat("lease_exhausted"), stat("lease_lost"), stat("lease_waited"), failOpen)
		t.Logf("steady: %s", steadyL.calls.line(steadyL.quota+steadyL.called))
		t.Logf("from a cold start: %s", cold.calls.line(cold.quota+cold.called))
		if p := pct(steadyL.quota, steadyL.called); p < 50 {
			t.Errorf("below the limit, steady, only %.1f%% of the allowed requests were decided in the filter", p)
		}
		if quota == 0 {
			t.Error("no request was admitted from a lease")
		}
	})
}
