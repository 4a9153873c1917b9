//go:build wasip1 && sluicetest

package main

import (
	"runtime"
	"strconv"
)

// memStats is global so that reading it allocates nothing itself.
var memStats runtime.MemStats

// sluiceTestMallocs exports the guest's allocation count for the tests'
// allocation check. It exists only in builds with the sluicetest tag.
//
//go:wasmexport sluice_test_mallocs
func sluiceTestMallocs() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Mallocs
}

var spinBuf [64]byte

//go:wasmexport sluice_test_spin
func sluiceTestSpin(n uint32) uint32 {
	var total uint32
	for i := uint32(0); i < n; i++ {
		b := strconv.AppendInt(spinBuf[:0], int64(i)*7919, 10)
		total += uint32(len(b))
	}
	return total
}
