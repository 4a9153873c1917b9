package rlqs

import (
	"math"
	"sort"
)

// Shares divides rate (requests per second) among Envoys by max-min fairness
// (water-filling): an Envoy whose demand is below an equal split of what is
// left gets all of its demand, and the rest is split equally among the
// others. demands[i] is Envoy i's demand in requests per second; +Inf means
// unknown (it takes an equal split). The shares sum to at most rate, and to
// exactly rate when the demands sum to more. Negative or NaN demands count
// as 0.
func Shares(rate float64, demands []float64) []float64 {
	shares := make([]float64, len(demands))
	if len(demands) == 0 || !(rate > 0) {
		return shares
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	clean := func(d float64) float64 {
		if !(d > 0) { // negative or NaN
			return 0
		}
		return d
	}
	sort.SliceStable(order, func(a, b int) bool { return clean(demands[order[a]]) < clean(demands[order[b]]) })
	left := rate
	for k, i := range order {
		fair := left / float64(len(order)-k)
		s := min(clean(demands[i]), fair)
		shares[i] = s
		left -= s
	}
	return shares
}

// Want is the demand Assign gives to Shares for an Envoy that reported
// demand requests per second: the demand plus headroom (a share of it) plus
// floor requests per second, so that an Envoy below its fair share never
// runs dry on the noise of its own rate, and an idle Envoy keeps a little
// quota for its next request. Unknown demand (NaN or +Inf) stays +Inf.
func Want(demand, headroom, floor float64) float64 {
	if math.IsNaN(demand) || math.IsInf(demand, 1) {
		return math.Inf(1)
	}
	return max(demand, 0)*(1+headroom) + floor
}

// Grant returns envoy's share of rate among the Envoys of a bucket, and
// how much of it is lent. It takes what the others' assignments in force
// leave free, up to its want (Want of its demand): the rate a departed
// Envoy held, or one that shrank left, goes at once to the next Envoy that
// reports, past its max-min fair share if need be (Shares over the Envoys'
// wants). An Envoy that this leaves below its fair share (a newcomer while
// the others hold the rate, an Envoy that reports after another took what
// was free) borrows the difference, at most lendable requests a second.
// Each Envoy's next report then takes only what is free, loans counted: so
// the assignments in force exceed rate only by what is lent, at most the
// Envoys' fair shares (the rate), for at most one report interval. Envoys
// are taken in the order of their ids, so that every replica computes the
// same shares.
func Grant(rate float64, all map[string]Envoy, envoy string, headroom, floor, lendable float64) (share, lent float64) {
	me, ok := all[envoy]
	if !ok || !(rate > 0) {
		return 0, 0
	}
	ids := make([]string, 0, len(all))
	for id := range all {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	wants := make([]float64, len(ids))
	i, others := 0, 0.0
	for k, id := range ids {
		wants[k] = Want(all[id].Demand, headroom, floor)
		if id == envoy {
			i = k
		} else {
			others += max(all[id].Assigned, 0)
		}
	}
	fair := Shares(rate, wants)[i]
	take := max(min(Want(me.Demand, headroom, floor), rate-others), 0)
	if take >= fair || !(lendable > 0) {
		return take, 0
	}
	lent = min(fair-take, lendable)
	return take + lent, lent
}
