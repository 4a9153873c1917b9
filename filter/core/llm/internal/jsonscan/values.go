package jsonscan

// Values are what a Scanner found in a document: the schema's integer and
// boolean slots, counters and flags (Scanner.Values), and the bytes of its
// captures (Scanner.Captured).
type Values struct {
	ints     [MaxInts]int64
	intSet   uint32
	intBad   uint32
	bools    uint8
	boolSet  uint8
	flags    uint8
	capOver  uint8
	counters [MaxCounters]int64
	capLen   [MaxCaptures]uint16
	capBuf   [CaptureBytes]byte
}

// Int returns slot's value, whether a value was set, and whether the last
// value found for it was not a whole number in [0, MaxInt].
func (vs *Values) Int(slot int) (v int64, set, bad bool) {
	bit := uint32(1) << slot
	return vs.ints[slot], vs.intSet&bit != 0, vs.intBad&bit != 0
}

// IntsSeen reports whether any slot in mask (bit i: slot i) was set or
// marked bad.
func (vs *Values) IntsSeen(mask uint32) bool { return (vs.intSet|vs.intBad)&mask != 0 }

// Bool returns slot's value and whether one was found.
func (vs *Values) Bool(slot int) (v, set bool) {
	bit := uint8(1) << slot
	return vs.bools&bit != 0, vs.boolSet&bit != 0
}

// Counter returns counter i.
func (vs *Values) Counter(i int) int64 { return vs.counters[i] }

// Flag reports whether flag i was set.
func (vs *Values) Flag(i int) bool { return vs.flags&(1<<i) != 0 }

// setBool sets a boolean slot.
func (vs *Values) setBool(slot int, v bool) {
	bit := uint8(1) << slot
	vs.boolSet |= bit
	if v {
		vs.bools |= bit
	} else {
		vs.bools &^= bit
	}
}

func (vs *Values) setBad(slot int) {
	vs.intBad |= 1 << slot
	vs.intSet &^= 1 << slot
}

// setInt gives slot (None: no slot) the value v, or marks it bad.
func (vs *Values) setInt(slot int, v uint64, ok bool) {
	switch {
	case slot == None:
	case ok:
		vs.ints[slot] = int64(v)
		vs.intSet |= 1 << slot
		vs.intBad &^= 1 << slot
	default:
		vs.setBad(slot)
	}
}
