package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"sync"

	"github.com/sluicehq/sluice/controlplane/store"
)

// A settlement token's dedupe key is what Redis keeps most of for a
// settlement: one key per charge for the dedupe TTL (15 minutes). Named
// after the limit's key and the token, it cost 165 bytes of used_memory
// with the filter's tokens and 325 with the longest ones. Named by a hash
// of both, in a short hash tag of the limit key's slot, every dedupe key
// has one small size (OnceMarkBytes), whatever the key and the token.

// onceKey returns the dedupe key of token on key: a 96-bit hash of the
// pair (no collision is to be expected below 2^48 tokens, and a client
// cannot aim one at another's unknown token), tagged so as to fall in
// key's hash slot (a Cluster script call sets it with the charge). At most
// 28 bytes: Redis then allocates its name in 32.
func onceKey(key, token string) string {
	h := sha256.New()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(token))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	tag := slotTags()[slot(hashTag(key))]
	b := make([]byte, 0, len(store.KeyPrefix)+len("{}")+len(tag)+16)
	b = append(b, store.KeyPrefix...)
	b = append(b, '{')
	b = append(b, tag...)
	b = append(b, '}')
	b = base64.RawURLEncoding.AppendEncode(b, sum[:12])
	return string(b)
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slot returns the hash slot of a key whose hash tag (or whole name) is
// tag: CRC16-XMODEM modulo 16384, as Redis computes it.
func slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// slotTags returns, for each hash slot, the shortest name of [0-9a-z]
// (first in that order) that hashes to it: at most 4 bytes.
var slotTags = sync.OnceValue(func() *[clusterSlots]string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var tags [clusterSlots]string
	left := clusterSlots
	var grow func(prefix []byte, n int)
	grow = func(prefix []byte, n int) {
		if n == 0 {
			if s := slot(string(prefix)); tags[s] == "" {
				tags[s] = string(prefix)
				left--
			}
			return
		}
		for i := 0; i < len(digits) && left > 0; i++ {
			grow(append(prefix, digits[i]), n-1)
		}
	}
	for n := 1; left > 0; n++ {
		grow(nil, n)
	}
	return &tags
})
