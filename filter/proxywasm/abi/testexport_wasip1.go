//go:build wasip1 && sluicetest

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, which staticcheck cannot see

package abi

// The exports of this file exist only in builds with the sluicetest tag.
// They break the cost of a precheck rejection down into its parts, for the
// benchmarks of package main (wasmhost_test.go): the callback frame, each
// host call the rejection makes, and all of them together.

// floorHost, floorBody and floorHeaders serve the host-call exports.
var (
	floorHost    = NewHost()
	floorBody    = []byte("rate limited\n")
	floorHeaders = []byte{0, 0, 0, 0} // an empty map
)

// missingProperty is a property path no host has.
const missingProperty = "sluice\x00no_such_property"

// sluiceTestHostFloor makes the host calls a precheck rejection cannot do
// without, and nothing else: the peer's address (with the
// proxy_on_memory_allocate it takes), the clock, a counter and the local
// reply, inside the same callback frame as the real callbacks. The tests'
// benchmark of it is the floor under BenchmarkRequestHeadersPrecheck.
//
//go:wasmexport sluice_test_host_floor
func sluiceTestHostFloor() (action uint32) {
	scratch.enter()
	defer guard()
	addr, _ := Stream{}.RemoteAddress()
	now := floorHost.Now()
	floorHost.IncrementCounter(1, 1)
	_ = Stream{}.SendLocalResponse(429, "sluice_precheck_over_limit", floorBody, floorHeaders)
	return uint32(len(addr)) + uint32(now&1)
}

// sluiceTestBare is an export that does nothing: the cost of entering and
// leaving the guest.
//
//go:wasmexport sluice_test_bare
func sluiceTestBare() uint32 { return 0 }

// sluiceTestFrame is an export with the callbacks' frame (the arena span
// and the deferred guard) and nothing in it.
//
//go:wasmexport sluice_test_frame
func sluiceTestFrame() (action uint32) {
	scratch.enter()
	defer guard()
	return 0
}

// sluiceTestProperty reads the peer's address in a callback frame: one
// host call, and proxy_on_memory_allocate called back from inside it.
//
//go:wasmexport sluice_test_property
func sluiceTestProperty() (action uint32) {
	scratch.enter()
	defer guard()
	addr, _ := Stream{}.RemoteAddress()
	return uint32(len(addr))
}

// sluiceTestPropertyMissing asks for a property the host does not have, in
// a callback frame: one host call without the proxy_on_memory_allocate.
//
//go:wasmexport sluice_test_property_missing
func sluiceTestPropertyMissing() (action uint32) {
	scratch.enter()
	defer guard()
	outData, outSize = 0, 0
	return proxyGetProperty(missingProperty, &outData, &outSize)
}

// sluiceTestClock reads the clock in a callback frame.
//
//go:wasmexport sluice_test_clock
func sluiceTestClock() (action uint32) {
	scratch.enter()
	defer guard()
	return uint32(floorHost.Now() & 1)
}

// sluiceTestMetric increments a counter in a callback frame.
//
//go:wasmexport sluice_test_metric
func sluiceTestMetric() (action uint32) {
	scratch.enter()
	defer guard()
	floorHost.IncrementCounter(1, 1)
	return 0
}

// sluiceTestLocalResponse sends the local reply in a callback frame.
//
//go:wasmexport sluice_test_local_response
func sluiceTestLocalResponse() (action uint32) {
	scratch.enter()
	defer guard()
	_ = Stream{}.SendLocalResponse(429, "sluice_precheck_over_limit", floorBody, floorHeaders)
	return 0
}
