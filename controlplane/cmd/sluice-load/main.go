package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Bounds on what one run may ask for.
const (
	maxCallers  = 4096
	maxConns    = 256
	maxKeys     = 10_000_000
	maxDuration = 10 * time.Minute
)

func main() {
	// The tool's heap is tiny and short-lived: collecting it less often
	// leaves more of the machine to the servers under test. GOGC wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// options are the flags.
type options struct {
	addr     string
	callers  int
	conns    int
	keys     int
	duration time.Duration
	requests int64
	domain   string
	key      string
	hits     uint
	timeout  time.Duration
	json     bool
	cpuprof  string
	client   string
}

// The clients -client selects.
const (
	clientLean = "lean" // leanConn: hand-written HTTP/2, little CPU per call
	clientGRPC = "grpc" // grpc-go
)

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("sluice-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "RLS gRPC address (loopback only)")
	fs.IntVar(&o.callers, "callers", 64, "concurrent callers, each calling back to back (at most 4096)")
	fs.IntVar(&o.conns, "conns", 4, "gRPC connections shared by the callers (at most 256)")
	fs.IntVar(&o.keys, "keys", 1000, "distinct descriptor values")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to run (at most 10m)")
	fs.Int64Var(&o.requests, "requests", 0, "stop after this many calls in all (0: run for -duration)")
	fs.StringVar(&o.domain, "domain", "sluice-demo", "rate-limit domain")
	fs.StringVar(&o.key, "key", "remote_address", "descriptor entry key")
	fs.UintVar(&o.hits, "hits", 0, "request hits_addend (0: the server's default of 1)")
	fs.DurationVar(&o.timeout, "timeout", time.Second, "per-call timeout")
	fs.BoolVar(&o.json, "json", false, "print the summary as one JSON object")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the load tool itself to this file")
	fs.StringVar(&o.client, "client", clientLean, "lean (a minimal gRPC client, so the tool takes little CPU from the servers) or grpc (grpc-go)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.callers < 1 || o.callers > maxCallers:
		return nil, fmt.Errorf("-callers must be 1..%d (got %d)", maxCallers, o.callers)
	case o.conns < 1 || o.conns > maxConns:
		return nil, fmt.Errorf("-conns must be 1..%d (got %d)", maxConns, o.conns)
	case o.keys < 1 || o.keys > maxKeys:
		return nil, fmt.Errorf("-keys must be 1..%d (got %d)", maxKeys, o.keys)
	case o.duration <= 0 || o.duration > maxDuration:
		return nil, fmt.Errorf("-duration must be in (0, %v] (got %v)", maxDuration, o.duration)
	case o.requests < 0:
		return nil, fmt.Errorf("-requests must not be negative (got %d)", o.requests)
	case o.timeout <= 0:
		return nil, fmt.Errorf("-timeout must be positive (got %v)", o.timeout)
	case o.domain == "":
		return nil, errors.New("-domain must not be empty")
	case o.client != clientLean && o.client != clientGRPC:
		return nil, fmt.Errorf("-client must be %s or %s (got %q)", clientLean, clientGRPC, o.client)
	case o.hits > 1<<32-1:
		return nil, fmt.Errorf("-hits must fit in 32 bits (got %d)", o.hits)
	}
	if err := checkLoopback(o.addr); err != nil {
		return nil, err
	}
	return o, nil
}

// checkLoopback refuses addresses that are not on this machine's loopback.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %v", addr, err)
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return fmt.Errorf("-addr %q: %v", addr, err)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("-addr %q: %s is not a loopback address; sluice-load only loads this machine", addr, ip)
		}
	}
	return nil
}

// Summary is the result of one run.
type Summary struct {
	Seconds      float64 `json:"seconds"`
	Decisions    int64   `json:"decisions"`
	PerSecond    float64 `json:"decisions_per_second"`
	OK           int64   `json:"ok"`
	OverLimit    int64   `json:"over_limit"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error,omitempty"`
	P50Ms        float64 `json:"p50_ms"`
	P95Ms        float64 `json:"p95_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Callers      int     `json:"callers"`
	Keys         int     `json:"keys"`
	Domain       string  `json:"domain"`
	DescriptorID string  `json:"descriptor_key"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-load:", err)
		return 2
	}
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			fmt.Fprintln(stderr, "sluice-load:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "sluice-load:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	s, err := load(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "sluice-load:", err)
		return 1
	}
	if o.json {
		b, _ := json.Marshal(s)
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "sluice-load: %s, %d callers, %d keys, domain %q key %q\n", o.addr, o.callers, o.keys, o.domain, o.key)
		fmt.Fprintf(stdout, "decisions: %d in %.2fs = %.0f/s  ok: %d  over_limit: %d  errors: %d\n",
			s.Decisions, s.Seconds, s.PerSecond, s.OK, s.OverLimit, s.Errors)
		fmt.Fprintf(stdout, "latency: p50 %.3fms  p95 %.3fms  p99 %.3fms  max %.3fms\n", s.P50Ms, s.P95Ms, s.P99Ms, s.MaxMs)
		if s.FirstError != "" {
			fmt.Fprintf(stdout, "first error: %s\n", s.FirstError)
		}
	}
	if s.Decisions == 0 {
		return 1
	}
	return 0
}

// caller is one caller's tallies.
type caller struct {
	hist           histogram
	ok, over, errs int64
	firstErr       error
}

// rlsCaller makes one caller's calls.
type rlsCaller interface {
	// ShouldRateLimit calls the service and returns the overall code.
	ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, error)
}

// grpcCaller calls through grpc-go, each call with its own timeout.
type grpcCaller struct {
	client  rlsv3.RateLimitServiceClient
	timeout time.Duration
}

func (g grpcCaller) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, error) {
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	resp, err := g.client.ShouldRateLimit(cctx, req)
	if err != nil {
		return 0, err
	}
	return resp.OverallCode, nil
}

// dial opens the connections and returns a caller factory (caller i) and
// a function closing them.
func dial(ctx context.Context, o *options) (func(i int) rlsCaller, func(), error) {
	if o.client == clientGRPC {
		conns := make([]*grpc.ClientConn, o.conns)
		closeAll := func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
		for i := range conns {
			c, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newCodeOnlyCodec())))
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			conns[i] = c
		}
		return func(i int) rlsCaller {
			return grpcCaller{client: rlsv3.NewRateLimitServiceClient(conns[i%len(conns)]), timeout: o.timeout}
		}, closeAll, nil
	}
	conns := make([]*leanConn, o.conns)
	closeAll := func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}
	for i := range conns {
		c, err := dialLean(ctx, o.addr, o.timeout)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns[i] = c
	}
	return func(i int) rlsCaller { return newLeanCaller(conns[i%len(conns)], o.timeout) }, closeAll, nil
}

// load runs the callers and sums their tallies.
func load(ctx context.Context, o *options) (*Summary, error) {
	newCaller, closeAll, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	values := make([]string, o.keys)
	for i := range values {
		values[i] = "k" + strconv.Itoa(i)
	}
	// The run ends at end. Calls cut short by it are not counted: a call's
	// timeout has its own timer, which may fire before the run's, so the
	// clock (not only ctx.Err) tells that the run is over.
	end := time.Now().Add(o.duration)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	over := func() bool { return ctx.Err() != nil || !time.Now().Before(end) }
	var issued atomic.Int64
	callers := make([]caller, o.callers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range callers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := &callers[i]
			client := newCaller(i)
			entry := &ratelimitv3.RateLimitDescriptor_Entry{Key: o.key}
			req := &rlsv3.RateLimitRequest{
				Domain:      o.domain,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry}}},
				HitsAddend:  uint32(o.hits),
			}
			for n := i; !over(); n += len(callers) {
				if o.requests > 0 && issued.Add(1) > o.requests {
					return
				}
				entry.Value = values[n%len(values)]
				t0 := time.Now()
				code, err := client.ShouldRateLimit(ctx, req)
				took := time.Since(t0)
				switch {
				case err != nil && over():
					return // the run ended during the call: not counted
				case err != nil:
					c.errs++
					if c.firstErr == nil {
						c.firstErr = err
					}
				case code == rlsv3.RateLimitResponse_OVER_LIMIT:
					c.over++
				default:
					c.ok++
				}
				c.hist.record(took)
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	s := &Summary{Seconds: elapsed.Seconds(), Callers: o.callers, Keys: o.keys, Domain: o.domain, DescriptorID: o.key}
	var h histogram
	for i := range callers {
		c := &callers[i]
		h.merge(&c.hist)
		s.OK += c.ok
		s.OverLimit += c.over
		s.Errors += c.errs
		if c.firstErr != nil && s.FirstError == "" {
			s.FirstError = c.firstErr.Error()
		}
	}
	s.Decisions = s.OK + s.OverLimit
	s.PerSecond = float64(s.Decisions) / elapsed.Seconds()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	s.P50Ms, s.P95Ms, s.P99Ms, s.MaxMs = ms(h.quantile(0.50)), ms(h.quantile(0.95)), ms(h.quantile(0.99)), ms(h.max)
	return s, nil
}
