package main

import (
	"context"
	"sync"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/filter/proxywasm/abi"
)

// hostShared is the shared data of one vm_id as proxy-wasm-cpp-host keeps
// it (src/shared_data.cc): behind one lock, a CAS number from one counter
// per set (never 0); a set with CAS 0, or of a key with no value, always
// succeeds; a set with another CAS than the key's is CAS_MISMATCH. No
// delete, no expiry.
type hostShared struct {
	mu   sync.Mutex
	m    map[string]hostSharedValue
	next uint32
	// beforeSet, if not nil, runs (unlocked) before a set is applied: a
	// VM on another thread writing in between.
	beforeSet func()
}

type hostSharedValue struct {
	v   []byte
	cas uint32
}

func newHostShared() *hostShared { return &hostShared{m: map[string]hostSharedValue{}} }

func (d *hostShared) get(key string) ([]byte, uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[key]
	return e.v, e.cas, ok
}

func (d *hostShared) set(key string, value []byte, cas uint32) abi.Status {
	if f := d.beforeSet; f != nil {
		d.beforeSet = nil
		f()
		d.beforeSet = f
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.m[key]; ok && cas != 0 && cas != e.cas {
		return abi.StatusCasMismatch
	}
	if d.next++; d.next == 0 {
		d.next = 1
	}
	d.m[key] = hostSharedValue{append([]byte(nil), value...), d.next}
	return abi.StatusOK
}

// size returns the number of keys and the bytes of keys and values.
func (d *hostShared) size() (keys, bytes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, v := range d.m {
		bytes += len(k) + len(v.v)
	}
	return len(d.m), bytes
}

// exportSharedData adds proxy_get_shared_data and proxy_set_shared_data on
// h.shared to the host module export builds.
func (h *wasmHost) exportSharedData(export func(name string, params []api.ValueType, f api.GoModuleFunc)) {
	export("proxy_get_shared_data", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		key, _ := m.Memory().Read(uint32(s[0]), uint32(s[1]))
		v, cas, ok := h.shared.get(string(key))
		if !ok {
			s[0] = uint64(abi.StatusNotFound)
			return
		}
		h.give(m, v, uint32(s[2]), uint32(s[3]))
		m.Memory().WriteUint32Le(uint32(s[4]), cas)
		s[0] = 0
	})
	export("proxy_set_shared_data", []api.ValueType{i32, i32, i32, i32, i32}, func(_ context.Context, m api.Module, s []uint64) {
		key, _ := m.Memory().Read(uint32(s[0]), uint32(s[1]))
		v, _ := m.Memory().Read(uint32(s[2]), uint32(s[3]))
		s[0] = uint64(h.shared.set(string(key), v, uint32(s[4])))
	})
}
