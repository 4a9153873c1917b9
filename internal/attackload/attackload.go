// Package attackload makes and counts the normal calls of other clients
// while a test attacks a listener: the share of them that succeed is what
// the attack takes away.
package attackload

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Tally counts calls and keeps the first failure. Its zero value is ready
// to use; it is safe for concurrent use.
type Tally struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	first      error
}

// Add counts the result of one call.
func (ty *Tally) Add(err error) {
	if err == nil {
		ty.ok.Add(1)
		return
	}
	ty.failed.Add(1)
	ty.mu.Lock()
	if ty.first == nil {
		ty.first = err
	}
	ty.mu.Unlock()
}

// Share is the share of the calls that succeeded, 0 if none was made.
func (ty *Tally) Share() float64 {
	ok, failed := ty.ok.Load(), ty.failed.Load()
	if ok+failed == 0 {
		return 0
	}
	return float64(ok) / float64(ok+failed)
}

// Check logs the tally and fails tb unless at least want of at least min
// calls succeeded.
func (ty *Tally) Check(tb testing.TB, name string, want float64, min int64) {
	tb.Helper()
	ok, failed := ty.ok.Load(), ty.failed.Load()
	ty.mu.Lock()
	first := ty.first
	ty.mu.Unlock()
	tb.Logf("%s: %d of %d normal calls succeeded during the attack (%.2f%%); first failure: %v", name, ok, ok+failed, 100*ty.Share(), first)
	if ok+failed < min {
		tb.Errorf("%s: only %d normal calls were made, want at least %d", name, ok+failed, min)
	}
	if ty.Share() < want {
		tb.Errorf("%s: %.2f%% of the normal calls succeeded, want at least %.1f%%", name, 100*ty.Share(), 100*want)
	}
}

// Load is one kind of normal call: Workers goroutines each make Call
// again and again and count it in Tally.
type Load struct {
	Workers int
	Call    func() error
	Tally   *Tally
}

// pause is the time each worker waits between its calls.
const pause = 5 * time.Millisecond

// During runs loads until done is closed, and returns when all their
// workers have stopped.
func During(done <-chan struct{}, loads ...Load) {
	var wg sync.WaitGroup
	for _, l := range loads {
		for range l.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-done:
						return
					default:
					}
					l.Tally.Add(l.Call())
					time.Sleep(pause)
				}
			}()
		}
	}
	wg.Wait()
}
