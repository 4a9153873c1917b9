package main

import "fmt"

// summarizeNative prints the native filter's goals against the medians
// that are there:
//   - 7n, spread: Envoy CPU per request at most setup 6's (Envoy's own
//     ratelimit filter, same control plane), requests/s at least 6's; the
//     native callout floor 2n beside it;
//   - locally decided requests: the filter's own cost (Envoy CPU per
//     request above Envoy alone's) at most a third of filter.wasm's: 4n
//     against 4 (above 1d, Envoy answering the same 429 itself), 7Ln
//     against 7L on the steady load (above 1);
//   - leases that cannot help cost nothing: 7L spread at most 1.05x 7
//     spread, on each host; and on the unique load, where no key is used
//     twice.
func summarizeNative(get func(string) (result, bool)) {
	if n, ok := get("7n/spread"); ok {
		if six, ok := get("6/spread"); ok {
			fmt.Printf("native callout (7n vs 6, spread): Envoy CPU %.2f against %.2f us per request = %.2fx (goal <= 1); %.2fx setup 6's req/s (goal >= 1)",
				n.envoyUS, six.envoyUS, n.envoyUS/six.envoyUS, n.rps/six.rps)
			if floor, ok := get("2n/spread"); ok {
				fmt.Printf("; the native floor 2n: %.2f us (%.2fx setup 6's), 7n is %.2f us above it", floor.envoyUS, floor.envoyUS/six.envoyUS, n.envoyUS-floor.envoyUS)
			}
			fmt.Println()
		}
		if w, ok := get("7/spread"); ok {
			fmt.Printf("native against Wasm (7n vs 7, spread): Envoy CPU %.2f against %.2f us per request (%.2fx), %.2fx req/s\n",
				n.envoyUS, w.envoyUS, n.envoyUS/w.envoyUS, n.rps/w.rps)
		}
	}
	ownCost("4n", "4", "blocked", "1d/blocked", get)
	ownCost("7Ln", "7L", "steady", "1/spread", get)
	for _, p := range [][2]string{{"7L", "7"}, {"7Ln", "7n"}} {
		for _, l := range []load{loadSpread, loadUnique} {
			leased, ok1 := get(p[0] + "/" + string(l))
			plain, ok2 := get(p[1] + "/" + string(l))
			if !ok1 || !ok2 {
				continue
			}
			fmt.Printf("leases that cannot help (%s vs %s, %s): Envoy CPU %.2f against %.2f us per request = %.2fx (goal <= 1.05); the control plane and Redis %.2f against %.2f",
				p[0], p[1], l, leased.envoyUS, plain.envoyUS, leased.envoyUS/plain.envoyUS, leased.rlsUS+leased.redUS, plain.rlsUS+plain.redUS)
			if s1, ok := get(p[0] + "/steady"); ok && l == loadSpread {
				if six, ok := get("6/steady"); ok {
					fmt.Printf("; %s steady serves %.2fx setup 6's req/s", p[0], s1.rps/six.rps)
				}
			}
			fmt.Println()
		}
	}
}

// ownCost prints the native setup n's own cost against the Wasm setup w's
// under load l, each above the floor base (Envoy alone: a setup and its
// load): goal at most a third.
func ownCost(n, w, l, base string, get func(string) (result, bool)) {
	rn, ok1 := get(n + "/" + l)
	rw, ok2 := get(w + "/" + l)
	floor, ok3 := get(base)
	if !ok1 || !ok2 || !ok3 {
		return
	}
	on, ow := rn.envoyUS-floor.envoyUS, rw.envoyUS-floor.envoyUS
	fmt.Printf("the filter's own cost, %s (%s vs %s, above %s): %.2f against %.2f us of Envoy CPU per request = %.2f of filter.wasm's (goal <= 0.33)\n",
		l, n, w, base, on, ow, on/ow)
}
