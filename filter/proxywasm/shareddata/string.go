package shareddata

import "unsafe"

// bytesString views b as a string without copying; b must not change while
// the string is in use (a value from the host, valid for the callback).
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
