//go:build !unix

package redisstore

import (
	"testing"
	"time"
)

// processCPU is not measured here: go-cpu-us/decision reads 0.
func processCPU(*testing.B) time.Duration { return 0 }
