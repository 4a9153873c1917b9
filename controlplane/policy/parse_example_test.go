package policy_test

import (
	"fmt"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// A policy in envoyproxy/ratelimit's format, with sluice's algorithm field:
// Parse validates it whole, and Match finds the limits of a request's
// descriptor.
func ExampleParse() {
	d, err := policy.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    value: premium
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 600, burst: 100}
`))
	if err != nil {
		panic(err)
	}
	for _, entries := range [][]policy.Entry{
		{{Key: "remote_address", Value: "10.0.0.1"}},
		{{Key: "api_key", Value: "premium"}},
		{{Key: "api_key", Value: "free"}},
	} {
		limits := d.Match(entries)
		if len(limits) == 0 {
			fmt.Printf("%s=%s: no limit\n", entries[0].Key, entries[0].Value)
		}
		for _, l := range limits {
			fmt.Printf("%s=%s: %s, %d per %s (burst %d), limit %s\n", entries[0].Key, entries[0].Value, l.Algorithm, l.Requests, l.Unit.Name(), l.Burst, l.ID)
		}
	}
	// Output:
	// remote_address=10.0.0.1: fixed_window, 10 per second (burst 0), limit remote_address#0
	// api_key=premium: token_bucket, 600 per minute (burst 100), limit api_key=premium#0
	// api_key=free: no limit
}

// A bad policy is refused whole, every error naming the file, line, domain
// and field.
func ExampleParse_errors() {
	_, err := policy.Parse("bad.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {algorithm: leaky_bucket, unit: second, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: fortnight, requests_per_unit: 5}
`))
	fmt.Println(err)
	// Output:
	// bad.yaml:5: domain "api": descriptors[0].rate_limit.algorithm: unknown algorithm "leaky_bucket" (want fixed_window, sliding_window, sliding_log, token_bucket, gcra or reserve)
	// bad.yaml:7: domain "api": descriptors[1].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
}
