package shareddata

import (
	"bytes"
	"encoding/binary"
)

// freedKey holds the proxy's freed mark (uint64, little endian): raised by
// one whenever a VM ends a shared block early (a refund freed its key), so
// that the other VMs drop the blocks they imported (Freed). One key more
// than the slots (Bound counts it).
const freedKey = "sluice.blocks.freed"

// Unblock ends the block shared for descriptor key, if its slot holds one
// that is live at now (it is rewritten to pass at now), and then raises
// the proxy's freed mark, so that the VMs that imported it drop it: the
// control plane said a refund freed the key. A key without a live block
// changes nothing (most refunds). A write that loses every race leaves the
// block (the other VMs then reject until its end, as they would have
// without the refund).
func (s *Store) Unblock(key []byte, now int64) {
	if !s.slot(key) {
		return
	}
	for range MaxAttempts {
		v, cas, found := s.data.SharedData(bytesString(s.name))
		if !found {
			return
		}
		b, k, ok := decode(v)
		if !ok || b.PassAt <= now || !bytes.Equal(k, s.key) {
			return
		}
		b.PassAt, b.RetryAt = now, now
		s.value = encode(s.value[:0], b, s.key)
		set, err := s.data.SetSharedData(bytesString(s.name), s.value, cas)
		if err != nil {
			return
		}
		if set {
			s.raiseFreed()
			return
		}
		s.Retries++
	}
}

// raiseFreed adds one to the proxy's freed mark.
func (s *Store) raiseFreed() {
	var b [8]byte
	for range MaxAttempts {
		v, cas, found := s.data.SharedData(freedKey)
		mark := uint64(0)
		if found && len(v) == 8 {
			mark = binary.LittleEndian.Uint64(v)
		} else {
			cas = 0
		}
		binary.LittleEndian.PutUint64(b[:], mark+1)
		set, err := s.data.SetSharedData(freedKey, b[:], cas)
		if err != nil || set {
			s.freed, s.freedAt, s.freedRead = mark+1, 0, false
			return
		}
		s.Retries++
	}
}

// Freed returns the proxy's freed mark, read at most once per LiveRefresh
// (one host call): it changes whenever a VM unblocks a key.
func (s *Store) Freed(now int64) uint64 {
	if s.freedRead && now-s.freedAt < LiveRefresh && now >= s.freedAt {
		return s.freed
	}
	s.freedAt, s.freedRead = now, true
	if v, _, found := s.data.SharedData(freedKey); found && len(v) == 8 {
		s.freed = binary.LittleEndian.Uint64(v)
	}
	return s.freed
}
