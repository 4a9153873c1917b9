package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/sluicehq/sluice/algorithms"
)

// KeyPrefix starts every key sluice writes.
const KeyPrefix = "sluice:"

// maxDirectKey is the longest key Key spells out; a longer identity is
// hashed. Redis keys up to 64 bytes also reuse objects inside scripts.
const maxDirectKey = 128

// Key returns the storage key for the state of one limit of one request
// descriptor, inside a Redis Cluster hash tag so that all of a limit's state
// shares one slot. No two different identities (domain, every entry's key
// and value, the limit's ID and its algorithm) ever share a key, whatever
// bytes they hold (':', '{', '}', newlines, 64 KB of text):
//
//   - An identity that fits in maxDirectKey is spelled out, readable in
//     redis-cli: "sluice:{domain:key=value:key=value|limitID|alg}", for
//     example "sluice:{api:user=alice|user#0|fw}". Every byte outside
//     [A-Za-z0-9] and "-_./#@+,;" is written as %XX, so the separators ':',
//     '=' and '|' and the braces only ever separate, and the encoding can be
//     read back (TestKeyInjective does).
//   - A longer identity is hashed: "sluice:{~" and the hex SHA-256 of the
//     identity, each part length-prefixed, then "}". '~' is escaped in the
//     spelled-out form, so the two forms never meet; two hashed keys meet
//     only if SHA-256 collides.
func Key(domain string, entries []Entry, limitID string, alg algorithms.Kind) string {
	code := kindCode(alg)
	n := len(KeyPrefix) + len("{||}") + escapedLen(domain) + escapedLen(limitID) + len(code)
	for _, e := range entries {
		n += len(":=") + escapedLen(e.Key) + escapedLen(e.Value)
	}
	if n > maxDirectKey {
		return hashedKey(domain, entries, limitID, code)
	}
	var small [maxDirectKey]byte
	b := append(small[:0], KeyPrefix...)
	b = append(b, '{')
	b = appendEscaped(b, domain)
	for _, e := range entries {
		b = append(b, ':')
		b = appendEscaped(b, e.Key)
		b = append(b, '=')
		b = appendEscaped(b, e.Value)
	}
	b = append(b, '|')
	b = appendEscaped(b, limitID)
	b = append(b, '|')
	b = append(b, code...)
	b = append(b, '}')
	return string(b)
}

// keepByte lists the bytes Key writes as they are; the rest become %XX.
var keepByte = func() (keep [256]bool) {
	for c := '0'; c <= '9'; c++ {
		keep[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		keep[c], keep[c-'a'+'A'] = true, true
	}
	for _, c := range "-_./#@+,;" {
		keep[c] = true
	}
	return keep
}()

// escapedLen returns the length of s escaped.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !keepByte[s[i]] {
			n += 2
		}
	}
	return n
}

// appendEscaped appends s to b, escaped.
func appendEscaped(b []byte, s string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		if c := s[i]; keepByte[c] {
			b = append(b, c)
		} else {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return b
}

// hashedKey returns the hashed form of Key.
func hashedKey(domain string, entries []Entry, limitID, code string) string {
	// The identity is laid out in one buffer and hashed at once; small
	// identities stay on the stack.
	var small [256]byte
	b := small[:0]
	put := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	put(domain)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		put(e.Key)
		put(e.Value)
	}
	put(limitID)
	put(code)
	sum := sha256.Sum256(b)
	var buf [len(KeyPrefix) + 3 + 2*sha256.Size]byte
	k := append(buf[:0], KeyPrefix...)
	k = append(k, '{', '~')
	k = hex.AppendEncode(k, sum[:])
	k = append(k, '}')
	return string(k)
}

// kindCode returns k's short name in keys.
func kindCode(k algorithms.Kind) string {
	switch k {
	case algorithms.KindFixedWindow:
		return "fw"
	case algorithms.KindSlidingWindow:
		return "sw"
	case algorithms.KindSlidingLog:
		return "sl"
	case algorithms.KindTokenBucket:
		return "tb"
	case algorithms.KindGCRA:
		return "gcra"
	case algorithms.KindReserve:
		return "rs"
	}
	return "unknown"
}
