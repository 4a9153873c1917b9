// Package timerate measures sluice's token bucket against the peer the
// foundation issue names, golang.org/x/time/rate, in the same run. It is a
// separate module so the peer never becomes a dependency of sluice itself.
//
//	cd bench/timerate && go test -run '^$' -bench . -benchmem -count 5
package timerate
