//go:build wasip1 && sluicetest

package abi

// floorHost, floorBody and floorHeaders serve sluiceTestHostFloor.
var (
	floorHost    = NewHost()
	floorBody    = []byte("rate limited\n")
	floorHeaders = []byte{0, 0, 0, 0} // an empty map
)

// sluiceTestHostFloor makes the host calls a precheck rejection cannot do
// without, and nothing else: the peer's address (with the
// proxy_on_memory_allocate it takes), the clock, a counter and the local
// reply, inside the same callback frame as the real callbacks. The tests'
// benchmark of it is the floor under BenchmarkRequestHeadersPrecheck. It
// exists only in builds with the sluicetest tag.
//
//go:wasmexport sluice_test_host_floor
func sluiceTestHostFloor() (action uint32) {
	scratch.enter()
	defer guard()
	addr, _ := floorHost.RemoteAddress()
	now := floorHost.Now()
	floorHost.IncrementCounter(1, 1)
	_ = floorHost.SendLocalResponse(429, "sluice_precheck_over_limit", floorBody, floorHeaders)
	return uint32(len(addr)) + uint32(now&1)
}
