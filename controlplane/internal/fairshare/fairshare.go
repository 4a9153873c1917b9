// Package fairshare divides a bounded resource (streams, bytes) among the
// clients that ask for it, so that no client keeps more than its share
// while another waits, whatever order they came in.
//
// A client may take from what is free while it holds less than its Share
// and leaves at least as much free as it holds (Fits). Greedy clients then
// hold total/(n+1) each and leave a share free for one more; a client that
// is alone, or first, takes at most half of what is left at each step. A
// client under its share that finds nothing free takes from the client
// that holds the most over it (preemption, done by the caller).
package fairshare

// Share returns each client's share of total when n clients hold some (or
// ask for some): total/(n+1), what each would hold were one more client to
// come, and at least 1.
func Share(total, n int64) int64 { return max(1, total/(n+1)) }

// Fits reports whether a client that holds held may take cost more from
// free, out of total, when holders clients (itself among them if held > 0)
// hold some: while it stays within its Share and leaves at least what it
// holds free.
func Fits(total, free, held, cost, holders int64) bool {
	n := holders
	if held == 0 {
		n++
	}
	return held+cost <= Share(total, n) && free-cost >= held
}
