package envoyratelimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestNativeFilter runs every scenario on every setup. The scenarios share
// one control plane and one Envoy per setup, each on descriptors of its own;
// the last one kills the control plane.
func TestNativeFilter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy and control planes")
	}
	if untilNext(time.Now(), 24*time.Hour) < time.Minute {
		// The day windows below would roll over mid-count.
		t.Skip("within a minute of UTC midnight: the day windows would reset mid-test")
	}
	for _, s := range setups {
		t.Run(s.String(), func(t *testing.T) {
			e := start(t, s)
			t.Run("RouteRequestHeaders", e.routeRequestHeaders)
			t.Run("RemoteAddress", e.remoteAddress)
			t.Run("HeaderValueMatch", e.headerValueMatch)
			t.Run("VirtualHost", e.virtualHost)
			t.Run("ResetSeconds", e.resetSeconds)
			t.Run("UnitMultiplier", e.unitMultiplier)
			t.Run("DescriptorHitsAddend", e.descriptorHitsAddend)
			t.Run("RequestHitsAddend", e.requestHitsAddend)
			t.Run("NegativeHits", e.negativeHits)
			t.Run("GRPC", e.grpcStatus)
			t.Run("ControlPlaneDown", e.controlPlaneDown) // last: kills the control plane
		})
	}
}

// answer is what a client got through Envoy, and when the request was under
// way (for the expected resets).
type answer struct {
	code          int
	h             http.Header
	before, after time.Time
}

// do sends a request to Envoy's listener with headers given as name, value
// pairs.
func (e *env) do(t *testing.T, listener, method, path string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, e.envoy.URL(listener)+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	client := &http.Client{Timeout: 10 * time.Second}
	before := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return answer{code: resp.StatusCode, h: resp.Header, before: before, after: time.Now()}
}

// untilNext returns how long from now until the next multiple of window
// since the Unix epoch: where a clock-aligned window ends.
func untilNext(now time.Time, window time.Duration) time.Duration {
	ns := now.UnixNano()
	return time.Duration(int64(window) - ns%int64(window))
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// want is the expected answer to one request. Every header named is checked
// to appear exactly once with that value ("" means absent; a value ending in
// "*" is a prefix, for the RateLimit header's t, which check compares with
// X-RateLimit-Reset). window is the clock-aligned window of the limit that
// X-RateLimit-Reset reports (see check).
type want struct {
	code    int
	headers map[string]string
	window  time.Duration // 0: X-RateLimit-Reset is checked as a header like the others
}

// check compares a with w. With w.window set, X-RateLimit-Reset must be the
// whole seconds, rounded up, left in the window when Envoy had the answer
// (between a.before and a.after), and the RateLimit header's t and
// Retry-After, when present, must say the same: all three come from one
// figure of the control plane, so a fraction dropped anywhere shows.
func check(t *testing.T, step string, a answer, w want) {
	t.Helper()
	if a.code != w.code {
		t.Errorf("%s: status %d, want %d (headers %v)", step, a.code, w.code, a.h)
	}
	for name, v := range w.headers {
		got := a.h.Values(name)
		switch {
		case v == "" && len(got) != 0:
			t.Errorf("%s: %s = %q, want none", step, name, got)
		case strings.HasSuffix(v, "*") && (len(got) != 1 || !strings.HasPrefix(got[0], v[:len(v)-1])):
			t.Errorf("%s: %s = %q, want exactly one starting %q", step, name, got, v[:len(v)-1])
		case v != "" && !strings.HasSuffix(v, "*") && (len(got) != 1 || got[0] != v):
			t.Errorf("%s: %s = %q, want exactly [%q]", step, name, got, v)
		}
	}
	if w.window == 0 {
		return
	}
	reset, err := strconv.ParseInt(a.h.Get("X-RateLimit-Reset"), 10, 64)
	lo, hi := ceilSeconds(untilNext(a.after, w.window)), ceilSeconds(untilNext(a.before, w.window))
	if hi < lo { // the window ended during the request
		hi += int64(w.window / time.Second)
	}
	if err != nil || reset < lo || reset > hi {
		t.Errorf("%s: X-RateLimit-Reset = %q, want the %v window's seconds left rounded up, %d..%d", step, a.h.Get("X-RateLimit-Reset"), w.window, lo, hi)
	}
	if rl := a.h.Get("RateLimit"); rl != "" && !strings.HasSuffix(rl, ";t="+strconv.FormatInt(reset, 10)) {
		t.Errorf("%s: RateLimit = %q, want t=%d as X-RateLimit-Reset says", step, rl, reset)
	}
	if ra := a.h.Get("Retry-After"); ra != "" && ra != strconv.FormatInt(reset, 10) {
		t.Errorf("%s: Retry-After = %q, want %d as X-RateLimit-Reset says", step, ra, reset)
	}
}

// day is the window of the policy's day limits.
const day = 24 * time.Hour

// h builds a header map from name, value pairs.
func h(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// routeRequestHeaders: a route's request_headers action, 3 a day per API
// key. Each answer carries Envoy's X-RateLimit-* headers and the control
// plane's RateLimit headers (response_headers_to_add); the 429 carries
// x-envoy-ratelimited and Retry-After.
func (e *env) routeRequestHeaders(t *testing.T) {
	limit := `3, 3;w=86400;name="per_key"`
	policy := `"per_key";q=3;w=86400`
	for i, rem := range []string{"2", "1", "0"} {
		check(t, "allowed "+strconv.Itoa(i), e.do(t, "open", "GET", "/key", "x-api-key", "k1"), want{200, h(
			"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", rem, "x-envoy-ratelimited", "", "Retry-After", "",
			"RateLimit-Policy", policy, "RateLimit", `"per_key";r=`+rem+";t=*"), day})
	}
	for i := range 2 {
		check(t, "refused "+strconv.Itoa(i), e.do(t, "open", "GET", "/key", "x-api-key", "k1"), want{429, h(
			"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true",
			"RateLimit-Policy", policy, "RateLimit", `"per_key";r=0;t=*`, "Retry-After", "*"), day})
	}
	if n := e.up.ByKey("k1"); n != 3 {
		t.Errorf("the upstream saw %d requests of k1, want 3", n)
	}
	check(t, "another key", e.do(t, "open", "GET", "/key", "x-api-key", "k2"), want{200, h(
		"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "2", "RateLimit", `"per_key";r=2;t=*`), day})
	// Without the header the action makes no descriptor: no call, no limit.
	check(t, "no key", e.do(t, "open", "GET", "/key"), want{200, h(
		"X-RateLimit-Limit", "", "X-RateLimit-Remaining", "", "RateLimit", "", "x-envoy-ratelimited", ""), 0})
}

// remoteAddress: a remote_address action, 2 a day per client address, on a
// limit without a name (Envoy's X-RateLimit-Limit then names none; the
// RateLimit header names the limit by its ID).
func (e *env) remoteAddress(t *testing.T) {
	limit := `2, 2;w=86400`
	policy := `"remote_address#0";q=2;w=86400`
	for i, rem := range []string{"1", "0"} {
		check(t, "allowed "+strconv.Itoa(i), e.do(t, "open", "GET", "/addr"), want{200, h(
			"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", rem, "RateLimit-Policy", policy,
			"RateLimit", `"remote_address#0";r=`+rem+";t=*"), day})
	}
	check(t, "refused", e.do(t, "open", "GET", "/addr"), want{429, h(
		"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true",
		"RateLimit", `"remote_address#0";r=0;t=*`, "Retry-After", "*"), day})
}

// headerValueMatch: a header_value_match action on :method POST, 1 a day;
// a GET makes no descriptor and is never limited.
func (e *env) headerValueMatch(t *testing.T) {
	limit := `1, 1;w=86400;name="posts"`
	check(t, "GET", e.do(t, "open", "GET", "/post"), want{200, h("X-RateLimit-Limit", ""), 0})
	check(t, "POST", e.do(t, "open", "POST", "/post"), want{200, h(
		"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "0", "RateLimit", `"posts";r=0;t=*`), day})
	check(t, "POST again", e.do(t, "open", "POST", "/post"), want{429, h(
		"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true"), day})
	check(t, "GET again", e.do(t, "open", "GET", "/post"), want{200, h("X-RateLimit-Limit", ""), 0})
}

// virtualHost: the virtual host's rate_limits (generic_key vh, 5 a day)
// apply to a route without its own; /both has its own (2 a day) and
// includes the virtual host's, so one call carries two descriptors, each
// counted on its own (as envoyproxy/ratelimit counts them), and Envoy's
// headers report the one with the least remaining.
func (e *env) virtualHost(t *testing.T) {
	vh := `5, 5;w=86400;name="per_host"`
	both := `2, 2;w=86400;name="both", 5;w=86400;name="per_host"`
	check(t, "vh", e.do(t, "open", "GET", "/vh"), want{200, h(
		"X-RateLimit-Limit", vh, "X-RateLimit-Remaining", "4", "RateLimit", `"per_host";r=4;t=*`), day})
	check(t, "both 1", e.do(t, "open", "GET", "/both"), want{200, h(
		"X-RateLimit-Limit", both, "X-RateLimit-Remaining", "1",
		"RateLimit-Policy", `"both";q=2;w=86400, "per_host";q=5;w=86400`), day})
	check(t, "both 2", e.do(t, "open", "GET", "/both"), want{200, h(
		"X-RateLimit-Limit", both, "X-RateLimit-Remaining", "0"), day})
	check(t, "both refused", e.do(t, "open", "GET", "/both"), want{429, h(
		"X-RateLimit-Limit", both, "X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true"), day})
	// per_host counted /vh once and /both three times (the refused one too:
	// its own limit allowed it).
	check(t, "vh last", e.do(t, "open", "GET", "/vh"), want{200, h(
		"X-RateLimit-Limit", vh, "X-RateLimit-Remaining", "0"), day})
	check(t, "vh refused", e.do(t, "open", "GET", "/vh"), want{429, h(
		"X-RateLimit-Limit", vh, "X-RateLimit-Remaining", "0"), day})
}

// resetSeconds: X-RateLimit-Reset is whole seconds rounded up (issue 13,
// item 1): 1 on a per-second limit (0 when the control plane sent
// 0.977 s), and the minute's seconds left, not one less.
//
// The per-second remaining count goes down by one a request within a
// second, and starts again at 999 in a new second: on a busy machine the
// three requests (and the /min ones between them) may span two seconds.
func (e *env) resetSeconds(t *testing.T) {
	prev := 0
	var prevBefore time.Time
	for i := range 3 {
		step := "second " + strconv.Itoa(i)
		a := e.do(t, "open", "GET", "/sec")
		check(t, step, a, want{200, h(
			"X-RateLimit-Limit", `1000, 1000;w=1;name="per_second"`, "X-RateLimit-Reset", "1",
			"RateLimit", `"per_second";r=*`), 0})
		rl := a.h.Get("RateLimit")
		var r int
		if _, err := fmt.Sscanf(rl, `"per_second";r=%d;t=1`, &r); err != nil || !strings.HasSuffix(rl, ";t=1") {
			t.Errorf("%s: RateLimit = %q, want \"per_second\";r=N;t=1", step, rl)
		}
		newSecond := i == 0 || a.after.Truncate(time.Second).After(prevBefore.Truncate(time.Second))
		switch {
		case i > 0 && r == prev-1: // the same second
		case r == 999 && newSecond: // the first request of a second
		default:
			t.Errorf("%s: RateLimit remaining %d after %d; want %d, or 999 in a new second", step, r, prev, prev-1)
		}
		prev, prevBefore = r, a.before
		check(t, "minute "+strconv.Itoa(i), e.do(t, "open", "GET", "/min"), want{200, h(
			"X-RateLimit-Limit", `1000, 1000;w=60;name="per_minute"`), time.Minute})
	}
}

// unitMultiplier: a 30 s window, which the control plane reports as 30
// SECOND (unit_multiplier 30). Envoy 1.40's X-RateLimit-Limit reads the
// multiplier (w=30, as the control plane's RateLimit-Policy says), and
// X-RateLimit-Reset is the seconds left in the clock-aligned 30 s window.
func (e *env) unitMultiplier(t *testing.T) {
	check(t, "30s", e.do(t, "open", "GET", "/multi"), want{200, h(
		"X-RateLimit-Limit", `30, 30;w=30;name="per_30s"`, "X-RateLimit-Remaining", "29",
		"RateLimit-Policy", `"per_30s";q=30;w=30`, "RateLimit", `"per_30s";r=29;t=*`), 30 * time.Second})
}

// descriptorHitsAddend: the rate_limits entry's hits_addend (Envoy 1.33+)
// from the x-cost header, on a fixed window and a token bucket of 10. A
// refused request counts nothing, and Envoy's 429 says
// X-RateLimit-Remaining: 0 even when the limiter holds more than a cheaper
// request needs. A cost above the limit has no Retry-After: no wait lets it
// pass; its X-RateLimit-Reset is the fixed window's end (as
// envoyproxy/ratelimit answers), and 0 for the token bucket, full now.
func (e *env) descriptorHitsAddend(t *testing.T) {
	for _, c := range []struct {
		path, name, limit string
		window            time.Duration // of the fixed window; 0: the bucket, full
	}{
		{"/cost", "cost", `10, 10;w=86400;name="cost"`, day},
		{"/bucket", "bucket", `10, 10;w=3600;name="bucket"`, 0},
	} {
		do := func(cost string) answer { return e.do(t, "open", "GET", c.path, "x-api-key", "c1", "x-cost", cost) }
		tooLarge := want{429, h("X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "0",
			"x-envoy-ratelimited", "true", "Retry-After", "", "RateLimit", `"`+c.name+`";r=0;t=0`), 0}
		if c.window > 0 {
			delete(tooLarge.headers, "X-RateLimit-Reset")
			tooLarge.headers["RateLimit"], tooLarge.window = `"`+c.name+`";r=0;t=*`, c.window
		}
		check(t, c.name+" 11 of 10", do("11"), tooLarge)
		check(t, c.name+" 4", do("4"), want{200, h(
			"X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", "6", "RateLimit", `"`+c.name+`";r=6;t=*`), 0})
		check(t, c.name+" 7 of 6", do("7"), want{429, h(
			"X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true",
			"Retry-After", "*", "RateLimit", `"`+c.name+`";r=0;t=*`), 0})
		check(t, c.name+" 6 of 6", do("6"), want{200, h(
			"X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", "0"), 0})
	}
	if n := e.up.ByKey("c1"); n != 4 {
		t.Errorf("the upstream saw %d requests of c1, want 4 (2 per limit)", n)
	}
}

// requestHitsAddend: the request's hits_addend, from the x-hits header
// through the envoy.ratelimit.hits_addend filter state, 10 a day.
func (e *env) requestHitsAddend(t *testing.T) {
	limit := `10, 10;w=86400;name="hits"`
	do := func(hdr ...string) answer {
		return e.do(t, "open", "GET", "/hits", append([]string{"x-api-key", "h1"}, hdr...)...)
	}
	check(t, "4", do("x-hits", "4"), want{200, h("X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "6"), day})
	check(t, "7 of 6", do("x-hits", "7"), want{429, h("X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "0"), day})
	check(t, "1 (no x-hits)", do(), want{200, h("X-RateLimit-Limit", limit, "X-RateLimit-Remaining", "5"), day})
}

// negativeHits: Envoy's is_negative_hits (a rate_limits entry's
// hits_addend with is_negative_hits, here from the x-refund header) gives
// capacity back, on a fixed window (3 a day) and a token bucket (3 an
// hour): a key used up refuses; a refund of 2 answers OK with
// X-RateLimit-Remaining: 2; the next two requests are admitted at once,
// the third refused. The refund's own request is never refused.
func (e *env) negativeHits(t *testing.T) {
	for _, c := range []struct{ kind, limit string }{
		{"window", `3, 3;w=86400;name="refundable"`},
		{"bucket", `3, 3;w=3600;name="refundable_bucket"`},
	} {
		use := func() answer { return e.do(t, "open", "GET", "/refundable/"+c.kind, "x-api-key", "r1") }
		for i, rem := range []string{"2", "1", "0"} {
			check(t, c.kind+" allowed "+strconv.Itoa(i), use(), want{200, h("X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", rem), 0})
		}
		check(t, c.kind+" used up", use(), want{429, h("X-RateLimit-Remaining", "0", "x-envoy-ratelimited", "true"), 0})
		check(t, c.kind+" refund of 2", e.do(t, "open", "GET", "/refund/"+c.kind, "x-api-key", "r1", "x-refund", "2"), want{200, h(
			"X-RateLimit-Limit", c.limit, "X-RateLimit-Remaining", "2", "x-envoy-ratelimited", ""), 0})
		check(t, c.kind+" after the refund", use(), want{200, h("X-RateLimit-Remaining", "1"), 0})
		check(t, c.kind+" after the refund, last", use(), want{200, h("X-RateLimit-Remaining", "0"), 0})
		check(t, c.kind+" used up again", use(), want{429, h("X-RateLimit-Remaining", "0"), 0})
		// A refund of more than was taken: never more than a full limiter.
		check(t, c.kind+" refund of 50", e.do(t, "open", "GET", "/refund/"+c.kind, "x-api-key", "r1", "x-refund", "50"), want{200, h(
			"X-RateLimit-Remaining", "3"), 0})
	}
	if n := e.up.ByKey("r1"); n != 2*(3+1+2+1) {
		t.Errorf("the upstream saw %d requests of r1, want %d (the refunds' own too)", n, 2*(3+1+2+1))
	}
}

// grpcStatus: gRPC calls through Envoy, 2 a day per listener; the refused
// call gets UNAVAILABLE (Envoy maps its 429 so by default) on "open" and
// RESOURCE_EXHAUSTED on "deny" (rate_limited_as_resource_exhausted).
func (e *env) grpcStatus(t *testing.T) {
	for _, c := range []struct {
		listener string
		code     codes.Code
	}{{"open", codes.Unavailable}, {"deny", codes.ResourceExhausted}} {
		conn, err := grpc.NewClient("passthrough:///"+e.envoy.ListenerAddr(c.listener),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		hc := healthpb.NewHealthClient(conn)
		for i := range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			want := codes.OK
			if i == 2 {
				want = c.code
			}
			if got := status.Code(err); got != want || (err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING) {
				t.Errorf("%s: call %d: %v (code %d), want code %d (%v)", c.listener, i, err, got, want, want)
			}
		}
		conn.Close()
	}
}

// controlPlaneDown: with the control plane killed, failure_mode_deny false
// lets requests through and true refuses them with 500, neither marked
// x-envoy-ratelimited; Envoy counts both.
func (e *env) controlPlaneDown(t *testing.T) {
	e.cp.Kill()
	before := e.up.ByKey("down")
	for i := range 3 {
		check(t, "open "+strconv.Itoa(i), e.do(t, "open", "GET", "/key", "x-api-key", "down"), want{200, h(
			"x-envoy-ratelimited", "", "X-RateLimit-Limit", "", "RateLimit", ""), 0})
		check(t, "deny "+strconv.Itoa(i), e.do(t, "deny", "GET", "/key", "x-api-key", "down"), want{500, h(
			"x-envoy-ratelimited", "", "X-RateLimit-Limit", ""), 0})
	}
	if n := e.up.ByKey("down") - before; n != 3 {
		t.Errorf("the upstream saw %d requests while the control plane was down, want the 3 of the open listener", n)
	}
	stats, err := e.envoy.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if n := stats["cluster.up.ratelimit.failure_mode_allowed"]; n != 3 {
		t.Errorf("cluster.up.ratelimit.failure_mode_allowed = %d, want 3", n)
	}
	if n := stats["cluster.up.ratelimit.error"]; n != 6 {
		t.Errorf("cluster.up.ratelimit.error = %d, want 6", n)
	}
}
