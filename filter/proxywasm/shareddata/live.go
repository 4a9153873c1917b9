package shareddata

import "encoding/binary"

// LiveRefresh (ns) bounds how long a VM goes on trusting what it last read
// of the proxy's live mark (liveKey): a block another VM publishes is
// seen by this VM's requests at most LiveRefresh after it was published.
// The slots of a proxy where no block is live are not read at all, but for
// one read of the mark per LiveRefresh: the requests of a load under every
// limit (most requests that call the control plane) read no slot.
const LiveRefresh = 2_000_000

// liveKey holds the latest PassAt of the blocks published in the proxy
// (int64, little endian), raised by every publication: no slot holds a
// block live after it. One key more than the slots (Bound counts it).
const liveKey = "sluice.blocks.live"

// MayHold reports whether a slot may hold a block that is live at now,
// from the proxy's live mark, which it reads when what it last read is
// over and was read LiveRefresh or longer ago (one host call). False lets
// the caller skip the slots' reads (Lookup).
func (s *Store) MayHold(now int64) bool {
	if s.liveUntil > now {
		return true
	}
	if s.liveRead && now-s.liveAt < LiveRefresh && now >= s.liveAt {
		return false
	}
	s.liveAt, s.liveRead = now, true
	if v, _, found := s.data.SharedData(liveKey); found && len(v) == 8 {
		s.liveUntil = int64(binary.LittleEndian.Uint64(v))
	}
	return s.liveUntil > now
}

// raiseLive raises the proxy's live mark to passAt, unless it is there
// already, with at most MaxAttempts compare-and-swaps. When every attempt
// lost (or the host refused, or two VMs set the mark when it had none yet:
// the later wins), the mark may stay lower than a block: the other VMs
// then miss that block, and ask the control plane as they would without
// sharing, never reject more.
//
// The mark only rises (but for that race), so a VM that raised or read it
// to passAt or later already makes no host call.
func (s *Store) raiseLive(passAt int64) {
	if s.liveUntil >= passAt {
		return
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(passAt))
	for range MaxAttempts {
		v, cas, found := s.data.SharedData(liveKey)
		if found && len(v) == 8 {
			if mark := int64(binary.LittleEndian.Uint64(v)); mark >= passAt {
				s.liveUntil = mark
				return
			}
		} else {
			cas = 0
		}
		set, err := s.data.SetSharedData(liveKey, b[:], cas)
		if err != nil {
			return
		}
		if set {
			s.liveUntil = passAt
			return
		}
		s.Retries++
	}
}
