package fairshare

import (
	"fmt"
	"testing"
)

// TestFits: a client takes while it stays within its share of the total
// and leaves at least what it holds free (streams: cost 1; bytes: more).
func TestFits(t *testing.T) {
	tests := []struct {
		name                             string
		total, free, held, cost, holders int64
		want                             bool
	}{
		{"alone, the first", 819, 819, 0, 1, 0, true},
		{"alone, at half", 819, 409, 409, 1, 1, false},
		{"none left", 819, 0, 0, 1, 64, false},
		{"64 greedy: under the share", 819, 51, 11, 1, 64, true},
		{"64 greedy: at the share", 819, 51, 12, 1, 64, false},
		{"at the share though many are free", 819, 700, 12, 1, 64, false},
		{"a newcomer counts itself", 819, 51, 0, 1, 64, true},
		{"a newcomer gets the last one", 819, 1, 0, 1, 64, true},
		{"more clients than units: one each", 819, 5, 0, 1, 2000, true},
		{"more clients than units: not two", 819, 5, 1, 1, 2000, false},
		{"bytes: a cost within the share", 1 << 20, 1 << 19, 1000, 4000, 3, true},
		{"bytes: a cost past the share", 1 << 20, 1 << 19, 262000, 4000, 3, false},
		{"bytes: a cost larger than what is free", 1 << 20, 3000, 0, 4000, 3, false},
	}
	for _, tc := range tests {
		if got := Fits(tc.total, tc.free, tc.held, tc.cost, tc.holders); got != tc.want {
			t.Errorf("%s: Fits(total %d, free %d, held %d, cost %d, holders %d) = %v, want %v",
				tc.name, tc.total, tc.free, tc.held, tc.cost, tc.holders, got, tc.want)
		}
	}
}

func ExampleFits() {
	// Three clients hold streams of a budget of 100, 10 are left; a fourth
	// asks for one, then a client that holds 30 asks for one more.
	fmt.Println(Fits(100, 10, 0, 1, 3), Fits(100, 10, 30, 1, 4))
	// Output: true false
}
