package grpcunary

import (
	"context"
	"errors"
	"testing"
	"time"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestCallCtx(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		end     func(c *callCtx, cancelParent, cancel context.CancelFunc)
		early   bool // Done is asked for before the end
		want    error
	}{
		{"live, no deadline", 0, func(*callCtx, context.CancelFunc, context.CancelFunc) {}, false, nil},
		{"live, deadline ahead", time.Hour, func(*callCtx, context.CancelFunc, context.CancelFunc) {}, true, nil},
		{"deadline passed", time.Hour, func(c *callCtx, _, _ context.CancelFunc) { c.deadline = time.Now().Add(-time.Second) }, false, context.DeadlineExceeded},
		{"cancelled", time.Hour, func(_ *callCtx, _, cancel context.CancelFunc) { cancel() }, false, context.Canceled},
		{"cancelled while waited on", time.Hour, func(_ *callCtx, _, cancel context.CancelFunc) { cancel() }, true, context.Canceled},
		{"parent ended", 0, func(_ *callCtx, cancelParent, _ context.CancelFunc) { cancelParent() }, false, context.Canceled},
		{"parent ended while waited on", time.Hour, func(_ *callCtx, cancelParent, _ context.CancelFunc) { cancelParent() }, true, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, cancelParent := context.WithCancel(context.Background())
			defer cancelParent()
			c := newCallCtx(parent, tt.timeout)
			cancel := c.cancel
			var done <-chan struct{}
			if tt.early {
				done = c.Done()
			}
			tt.end(c, cancelParent, cancel)
			if tt.early && tt.want != nil {
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("Done never closed")
				}
			}
			if err := c.Err(); !errors.Is(err, tt.want) {
				t.Fatalf("Err = %v, want %v", err, tt.want)
			}
			if got := closed(c.Done()); got != (tt.want != nil) {
				t.Fatalf("Done closed: %v, want %v", got, tt.want != nil)
			}
			cancel() // after the end, nothing changes
			if err := c.Err(); tt.want != nil && err != tt.want {
				t.Fatalf("Err after cancel = %v, want %v still", err, tt.want)
			}
		})
	}
}

// TestCallCtxTimerFires checks the timer the first Done starts: the
// deadline ends the context with nobody asking Err.
func TestCallCtxTimerFires(t *testing.T) {
	c := newCallCtx(context.Background(), 5*time.Millisecond)
	defer c.cancel()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done never closed at the deadline")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v", c.Err())
	}
}

func TestCallCtxDeadline(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pd, _ := parent.Deadline()
	if d, ok := (&callCtx{parent: parent}).Deadline(); !ok || !d.Equal(pd) {
		t.Fatalf("no deadline of its own: %v %v, want the parent's %v", d, ok, pd)
	}
	c := newCallCtx(parent, time.Second)
	defer c.cancel()
	if d, ok := c.Deadline(); !ok || !d.Before(pd) {
		t.Fatalf("Deadline = %v %v, want its own, before the parent's", d, ok)
	}
	c2 := newCallCtx(parent, time.Hour)
	defer c2.cancel()
	if d, _ := c2.Deadline(); !d.Equal(pd) {
		t.Fatalf("Deadline = %v, want the parent's, which is earlier", d)
	}
	if _, ok := (&callCtx{parent: context.Background()}).Deadline(); ok {
		t.Fatal("a deadline without one")
	}
}
