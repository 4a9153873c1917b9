package dynmod

import "testing"

func TestProcsFor(t *testing.T) {
	for _, c := range []struct {
		current, workers int
		env              string
		want             int
	}{
		{2, 2, "", 4}, // a 2-core machine, 2 workers: a P each, the main thread's, one spare
		{2, 1, "", 3},
		{16, 2, "", 0}, // enough already
		{4, 2, "", 0},
		{2, 8, "", 10}, // more workers than cores
		{2, 2, "1", 0}, // the operator's setting stands
		{2, 2, "64", 0},
	} {
		if got := procsFor(c.current, c.workers, c.env); got != c.want {
			t.Errorf("procsFor(%d, %d, %q) = %d, want %d", c.current, c.workers, c.env, got, c.want)
		}
	}
}
