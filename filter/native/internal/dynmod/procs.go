package dynmod

import (
	"os"
	"runtime"
	"sync"
)

// Envoy's threads enter the Go runtime through cgo callbacks and, between
// hooks, hold their P as a goroutine in a system call would. With no P idle,
// the runtime's sysmon takes a P back from a thread within 20 us and wakes
// another thread to spin for work that is not there, and the thread that
// comes back into Go must find a P again: thread wake-ups on every few
// requests (perf: finish_task_switch 12.5% of Envoy's samples against 4.0%
// with filter.wasm, on leased requests). With a P for each worker thread,
// one for the main thread and one for the runtime's own goroutines, a P
// stays idle and sysmon leaves the others alone (for 10 ms at a time).
// Setup 7Ln steady, 2 workers: 83 us of Envoy CPU a request at GOMAXPROCS 2,
// 68-71 us at 4.

var sizeOnce sync.Once

// sizeRuntime gives the Go runtime enough Ps for Envoy's worker threads,
// once per process (when the first filter configuration is made, on the
// main thread), unless the operator set GOMAXPROCS.
func sizeRuntime(workers int) {
	sizeOnce.Do(func() {
		if n := procsFor(runtime.GOMAXPROCS(0), workers, os.Getenv("GOMAXPROCS")); n > 0 {
			runtime.GOMAXPROCS(n)
		}
	})
}

// procsFor returns the GOMAXPROCS for Envoy's workers worker threads when
// it is current and the environment says env: workers + 2 if that is more,
// else 0 (leave it).
func procsFor(current, workers int, env string) int {
	if env != "" || workers+2 <= current {
		return 0
	}
	return workers + 2
}
