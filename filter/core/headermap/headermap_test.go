package headermap

import (
	"reflect"
	"testing"
)

func TestHeaderMapRoundTrip(t *testing.T) {
	pairs := [][2]string{{":status", "429"}, {"retry-after", "3"}, {"empty", ""}, {"", "no-key"}}
	data := Append(nil, pairs)
	// The spec's layout: count, sizes, then NUL-terminated keys and values.
	want := []byte{4, 0, 0, 0,
		7, 0, 0, 0, 3, 0, 0, 0,
		11, 0, 0, 0, 1, 0, 0, 0,
		5, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 6, 0, 0, 0,
	}
	want = append(want, ":status\x00429\x00retry-after\x003\x00empty\x00\x00\x00no-key\x00"...)
	if !reflect.DeepEqual(data, want) {
		t.Fatalf("serialized\n got  %q\n want %q", data, want)
	}
	got, err := Parse(nil, data)
	if err != nil || !reflect.DeepEqual(got, pairs) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	if empty := Append(nil, nil); !reflect.DeepEqual(empty, []byte{0, 0, 0, 0}) {
		t.Fatalf("empty map = %v, want a 4-byte zero count", empty)
	}
}

func TestParseHeaderMapEmptyAndMalformed(t *testing.T) {
	for _, empty := range [][]byte{nil, {0}, {0, 0, 0, 0}} {
		if got, err := Parse(nil, empty); err != nil || len(got) != 0 {
			t.Errorf("Parse(%v) = %v, %v", empty, got, err)
		}
	}
	good := Append(nil, [][2]string{{"a", "1"}})
	for _, bad := range [][]byte{
		{1, 0},
		{1, 0, 0, 0},                  // sizes missing
		good[:len(good)-1],            // truncated
		append(good[:len(good)-1], 7), // value not NUL-terminated
		{0xff, 0xff, 0xff, 0xff, 0},   // absurd count
	} {
		if _, err := Parse(nil, bad); err == nil {
			t.Errorf("Parse(%v) accepted a malformed map", bad)
		}
	}
}
