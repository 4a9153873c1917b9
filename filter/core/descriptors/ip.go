package descriptors

// The filter validates addresses itself: net/netip costs about 170 KB of
// filter.wasm and a microsecond per parse in the guest. The rules are
// netip.ParseAddr's; the tests hold the two to the same answers.

// isIP reports whether s is an IPv4 or IPv6 address in text form.
func isIP(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			return isIPv4(s)
		case ':':
			return isIPv6(s)
		}
	}
	return false
}

// isIPv4 reports whether s is a dotted quad: four decimal fields of at most
// 255, without leading zeros.
func isIPv4(s string) bool {
	fields, val, digits := 0, 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if digits == 0 {
				return false
			}
			fields++
			val, digits = 0, 0
			continue
		}
		c := s[i]
		if c < '0' || c > '9' || (digits == 1 && val == 0) {
			return false // not a digit, or a leading zero
		}
		val = val*10 + int(c-'0')
		digits++
		if val > 255 {
			return false
		}
	}
	return fields == 4
}

// dottedQuadPrefix returns the length of the dotted quad s starts with (as
// isIPv4 defines it), or 0 if it does not start with one. The quad ends at
// the end of s or at the first byte that is neither a digit nor a dot.
//
// It reads a field at a time, at most three digits each: on the remote
// address path of every request, that is about half the branches of a
// byte-at-a-time state machine, which filter.wasm pays for dearly.
func dottedQuadPrefix(s string) int {
	i := 0
	for field := 0; field < 4; field++ {
		if field > 0 {
			if i >= len(s) || s[i] != '.' {
				return 0
			}
			i++
		}
		start, val := i, 0
		for i < len(s) && i-start < 3 {
			d := s[i] - '0'
			if d > 9 {
				break
			}
			val = val*10 + int(d)
			i++
		}
		if n := i - start; n == 0 || val > 255 || (n > 1 && s[start] == '0') {
			return 0 // no digits, over 255, or a leading zero
		}
	}
	if i < len(s) && (s[i] == '.' || s[i]-'0' <= 9) {
		return 0 // a fourth digit, or a fifth field
	}
	return i
}

// isIPv6 reports whether s is an IPv6 address: up to eight groups of one to
// four hex digits separated by ':', one "::" standing for one or more zero
// groups, the last 32 bits optionally as a dotted quad, and an optional
// non-empty "%zone".
func isIPv6(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i == len(s)-1 {
				return false
			}
			s = s[:i]
			break
		}
	}
	groups, ellipsis := 0, false
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		ellipsis = true
		s = s[2:]
		if s == "" {
			return true
		}
	}
	for s != "" {
		// One group: hex digits, or a dotted quad ending the address.
		n := 0
		for n < len(s) && n < 5 && isHex(s[n]) {
			n++
		}
		if n < len(s) && s[n] == '.' {
			if !isIPv4(s) {
				return false
			}
			groups += 2
			s = ""
			break
		}
		if n == 0 || n > 4 {
			return false
		}
		groups++
		s = s[n:]
		if s == "" {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return false
		}
		if s[1] == ':' {
			if ellipsis {
				return false
			}
			ellipsis = true
			s = s[2:]
			if s == "" {
				break
			}
			continue
		}
		s = s[1:]
	}
	if ellipsis {
		return groups < 8
	}
	return groups == 8
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}
