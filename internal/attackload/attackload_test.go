package attackload

import (
	"errors"
	"testing"
)

func TestTallyShare(t *testing.T) {
	fail := errors.New("refused")
	for _, tt := range []struct {
		name    string
		results []error
		want    float64
	}{
		{"none", nil, 0},
		{"all ok", []error{nil, nil}, 1},
		{"one of four failed", []error{nil, fail, nil, nil}, 0.75},
		{"all failed", []error{fail}, 0},
	} {
		var ty Tally
		for _, err := range tt.results {
			ty.Add(err)
		}
		if got := ty.Share(); got != tt.want {
			t.Errorf("%s: Share() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestDuringStopsAtDone(t *testing.T) {
	done := make(chan struct{})
	var a, b Tally
	calls := 0
	During(done,
		Load{Workers: 1, Call: func() error {
			if calls++; calls == 3 {
				close(done)
			}
			return nil
		}, Tally: &a},
		Load{Workers: 0, Call: func() error { panic("no worker") }, Tally: &b})
	if got := a.ok.Load(); got != 3 {
		t.Errorf("%d calls counted, want 3 (During must stop once done is closed)", got)
	}
	if b.Share() != 0 || b.ok.Load()+b.failed.Load() != 0 {
		t.Error("a load of no workers made calls")
	}
}
