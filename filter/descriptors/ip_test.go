package descriptors

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func checkIP(t *testing.T, s string) {
	t.Helper()
	_, err := netip.ParseAddr(s)
	if got, want := isIP(s), err == nil; got != want {
		t.Errorf("isIP(%q) = %v, netip.ParseAddr says %v (%v)", s, got, want, err)
	}
}

func TestIsIPMatchesNetip(t *testing.T) {
	for _, s := range []string{
		"1.2.3.4", "0.0.0.0", "255.255.255.255", "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1..2.3", "1.2.3.4.",
		"::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6::7:8",
		"1::2::3", ":1:2:3:4:5:6:7", "1:2:3:4:5:6:7:", "12345::", "abcd:EF01::", "g::", "::ffff:1.2.3.4", "::1.2.3.4",
		"1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "::ffff:1.2.3", "fe80::1%eth0", "fe80::1%", "1.2.3.4%eth0",
		"", ":", ":::", "1:2", "0:0:0:0:0:0:0:0", "::0:0:0:0:0:0:0", "1.2.3.-4", "1.2.3.4a", "::1.2.3.4:5",
	} {
		checkIP(t, s)
	}
}

// TestIsIPRandom compares with netip on random strings over the alphabet
// of addresses.
func TestIsIPRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const alphabet = "0123456789abcdefABCDEF:.%z"
	for i := 0; i < 200000; i++ {
		b := make([]byte, 1+rng.IntN(20))
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		checkIP(t, string(b))
	}
	// And on mutations of valid addresses.
	for i := 0; i < 20000; i++ {
		var a netip.Addr
		if rng.IntN(2) == 0 {
			a = netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), 0, byte(rng.IntN(3))})
		} else {
			var b [16]byte
			for j := range b {
				if rng.IntN(3) == 0 {
					b[j] = byte(rng.Uint32())
				}
			}
			a = netip.AddrFrom16(b)
		}
		s := []byte(a.String())
		checkIP(t, string(s))
		s[rng.IntN(len(s))] = alphabet[rng.IntN(len(alphabet))]
		checkIP(t, string(s))
	}
}

func FuzzIsIP(f *testing.F) {
	f.Add("::ffff:1.2.3.4")
	f.Add("fe80::1%eth0")
	f.Fuzz(func(t *testing.T, s string) { checkIP(t, s) })
}
