package shareddata

import "strings"

// Local is a Data of one VM's own, for a plugin whose VMs do not share
// their state (plugin option shared_state: false): the leases then make one
// pool per VM, in the same table of slots, as if the VM were alone in its
// proxy. It has the host's semantics (a CAS number per key, never 0; a key
// with no value is set whatever the CAS) and, since the tables write only
// their fixed slot names, the same bound (Bound, LeaseBound). It is not
// safe for concurrent use; a VM is single-threaded.
type Local struct {
	m    map[string]*localValue
	next uint32 // the last CAS number given out
}

type localValue struct {
	v   []byte
	cas uint32
}

// NewLocal returns an empty Local.
func NewLocal() *Local { return &Local{m: map[string]*localValue{}} }

// SharedData implements Data. The value is valid until key is set again.
func (l *Local) SharedData(key string) ([]byte, uint32, bool) {
	e, ok := l.m[key]
	if !ok {
		return nil, 0, false
	}
	return e.v, e.cas, true
}

// SetSharedData implements Data. It copies key (the tables pass scratch
// memory) and value.
func (l *Local) SetSharedData(key string, value []byte, cas uint32) (bool, error) {
	e, ok := l.m[key]
	if ok && cas != 0 && cas != e.cas {
		return false, nil
	}
	if !ok {
		e = &localValue{}
		l.m[strings.Clone(key)] = e
	}
	l.next++
	if l.next == 0 {
		l.next = 1
	}
	e.v, e.cas = append(e.v[:0], value...), l.next
	return true, nil
}
