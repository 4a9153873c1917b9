package connbounds

import (
	"testing"
	"time"
)

func TestWithDefaults(t *testing.T) {
	tests := []struct {
		name    string
		in, out Bounds
	}{
		{"zero", Bounds{}, Default},
		{"negative is zero", Bounds{MaxConns: -1, IdleTimeout: -time.Second}, Default},
		{"set fields kept", Bounds{MaxConns: 9, MaxMsgBytes: 1000, BodyTimeout: time.Second}, func() Bounds {
			b := Default
			b.MaxConns, b.MaxMsgBytes, b.BodyTimeout = 9, 1000, time.Second
			return b
		}()},
		{"first call within idle", Bounds{IdleTimeout: time.Second}, func() Bounds {
			b := Default
			b.IdleTimeout, b.FirstCallTimeout = time.Second, time.Second
			return b
		}()},
	}
	for _, tc := range tests {
		if got := tc.in.WithDefaults(); got != tc.out {
			t.Errorf("%s: %+v\nwant %+v", tc.name, got, tc.out)
		}
	}
}

func TestListeners(t *testing.T) {
	d := Bounds{IdleTimeout: time.Minute}
	op := d.Operator(1 << 20)
	if op.MaxConns != 64 || op.MaxStreamsPerConn != 16 || op.MaxMsgBytes != 1<<20 || op.IdleTimeout != time.Minute ||
		op.FirstCallTimeout != Default.FirstCallTimeout || op.MaxHeaderBytes != Default.MaxHeaderBytes {
		t.Errorf("Operator: %+v", op)
	}
	r := d.RLQS()
	if r.MaxConns != Default.MaxConns || r.MaxStreamsPerConn != 16 || r.MaxMsgBytes != 128<<10 || r.IdleTimeout != time.Minute {
		t.Errorf("RLQS: %+v", r)
	}
	if got := (Bounds{MaxConns: 3}).Or(r); got.MaxConns != 3 || got.MaxStreamsPerConn != 16 || got.MaxMsgBytes != 128<<10 {
		t.Errorf("Or: %+v", got)
	}
	if Default.MaxHeaderBlock() != 32<<10 {
		t.Errorf("MaxHeaderBlock = %d", Default.MaxHeaderBlock())
	}
}
