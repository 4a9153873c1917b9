package rls

import (
	"fmt"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/controlplane/store/memory"
)

const reservePolicy = `domain: shaping
descriptors:
  - key: user
    rate_limit: {algorithm: reserve, unit: second, requests_per_unit: 10, burst: 2, max_wait: 300ms}
  - key: both
    rate_limits:
      - {algorithm: reserve, unit: second, requests_per_unit: 10, burst: 1, max_wait: 1s}
      - {algorithm: reserve, unit: second, requests_per_unit: 4, burst: 1, max_wait: 1s}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 100}
`

// TestReserveWait: reserve answers OK with the wait in the metadata
// (wait_ms), each caller of one instant one slot later, and OVER_LIMIT once
// the wait would pass max_wait; a descriptor with two reserve limits waits
// for the later slot; the wait survives the codec's hand encoding.
func TestReserveWait(t *testing.T) {
	c := &clock{}
	c.ns.Store(epoch.UnixNano())
	svc, err := New(memory.New(memory.Options{Now: c.Now}), parse(t, reservePolicy), Options{Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, clock: c}
	codec := NewCodec(svc)
	wait := func(resp *rlsv3.RateLimitResponse, i int) any {
		// Through the wire, as the filter reads it.
		b, err := codec.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var back rlsv3.RateLimitResponse
		if err := proto.Unmarshal(b.Materialize(), &back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&back, resp) {
			t.Fatalf("codec changed the response:\n%v\n%v", &back, resp)
		}
		return metaList(t, &back)[i][MetaWait]
	}
	var got []string
	for range 7 {
		resp := f.call(t, req("shaping", desc("user=u"), desc("plain=p")))
		got = append(got, fmt.Sprintf("%s/%v/%v", resp.OverallCode, wait(resp, 0), wait(resp, 1)))
	}
	want := []string{
		"OK/<nil>/<nil>", "OK/<nil>/<nil>", "OK/<nil>/<nil>", // burst 2 and the one that pays later
		"OK/100/<nil>", "OK/200/<nil>", "OK/300/<nil>",
		"OVER_LIMIT/<nil>/<nil>", // 400 ms > max_wait
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	resp := f.call(t, req("shaping", desc("user=u")))
	if m := metaList(t, resp)[0]; resp.OverallCode != over || m[MetaRetryAfter] != 100.0 {
		t.Errorf("refused: %v %v", resp.OverallCode, m)
	}

	// Two reserve limits on one descriptor: the later slot decides.
	got = got[:0]
	for range 4 {
		resp := f.call(t, req("shaping", desc("both=b")))
		got = append(got, fmt.Sprintf("%s/%v", resp.OverallCode, wait(resp, 0)))
	}
	if fmt.Sprint(got) != "[OK/<nil> OK/<nil> OK/250 OK/500]" {
		t.Errorf("two limits: %v", got)
	}
}
