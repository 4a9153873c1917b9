package shareddata

import "testing"

// TestLocalIsOneVMsPool: leases over a Local are the pool of the VM that
// holds it: spent unit by unit there, invisible to a VM with its own, and
// a CAS number that changed refuses the write, as the host's does.
func TestLocalIsOneVMsPool(t *testing.T) {
	a, b := NewLeases(NewLocal(), "edge", 64), NewLeases(NewLocal(), "edge", 64)
	key := []byte("\x07api_key\x02k1")
	if ok, err := a.Grant(key, 2, 500*ms, 0); !ok || err != nil {
		t.Fatalf("grant: %v %v", ok, err)
	}
	if b.Covers(key, 100*ms) {
		t.Fatal("a VM's own pool seen by another VM")
	}
	for i := range 2 {
		if took, err := a.Take(key, 100*ms); !took.OK || err != nil {
			t.Fatalf("take %d: %+v %v", i, took, err)
		}
	}
	if took, _ := a.Take(key, 100*ms); took.OK {
		t.Fatal("a third unit of two")
	}

	l := NewLocal()
	name := []byte("sluice.leases.1")
	if set, _ := l.SetSharedData(string(name), []byte("x"), 7); !set {
		t.Fatal("a key with no value was not set")
	}
	_, cas, _ := l.SharedData("sluice.leases.1")
	name[0] = 'X' // the tables reuse their scratch: the stored key is a copy
	if set, _ := l.SetSharedData("sluice.leases.1", []byte("y"), cas+1); set {
		t.Fatal("a stale CAS number was accepted")
	}
	if set, _ := l.SetSharedData("sluice.leases.1", []byte("y"), cas); !set {
		t.Fatal("the current CAS number was refused")
	}
	if v, cas2, ok := l.SharedData("sluice.leases.1"); !ok || string(v) != "y" || cas2 == cas || cas2 == 0 {
		t.Fatalf("after the write: %q %d %v", v, cas2, ok)
	}
}
