package descriptors

import (
	"math/rand/v2"
	"net/netip"
	"strconv"
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

// TestHostIPFastPathMatches compares HostIP, whose IPv4 fast path skips the
// general parse, with the general parse on random addresses.
func TestHostIPFastPathMatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const alphabet = "0123456789.:[]a%"
	for _, addr := range []string{"1.2.3.4", "1.2.3.4:80", "1.2.3.4:", "1.2.3.4::80", "1.2.3.4:8:0", "1.2.3.4.5:80",
		"01.2.3.4:80", "1.2.3.256:80", "1.2.3:80", "1.2.3.4a:80", "1.2.3.4%z:80", "255.255.255.255:65535", "0.0.0.0"} {
		ip, ok := HostIP(addr)
		wantIP, wantOK := hostIP(addr)
		if ip != wantIP || ok != wantOK {
			t.Errorf("HostIP(%q) = %q, %v; the general parse says %q, %v", addr, ip, ok, wantIP, wantOK)
		}
	}
	for i := 0; i < 200000; i++ {
		b := make([]byte, 1+rng.IntN(24))
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		addr := string(b)
		if rng.IntN(2) == 0 { // mostly a plausible IPv4 start
			addr = "10." + strconv.Itoa(rng.IntN(300)) + ".0." + addr
		}
		ip, ok := HostIP(addr)
		wantIP, wantOK := hostIP(addr)
		if ip != wantIP || ok != wantOK {
			t.Fatalf("HostIP(%q) = %q, %v; the general parse says %q, %v", addr, ip, ok, wantIP, wantOK)
		}
	}
}

// TestDottedQuadPrefixMatchesIsIPv4 runs dottedQuadPrefix over every dotted
// quad of tricky fields (leading zeros, the bounds around 255, empty and too
// long fields), bare and followed by a port.
func TestDottedQuadPrefixMatchesIsIPv4(t *testing.T) {
	fields := []string{"", "0", "00", "01", "1", "9", "10", "19", "99", "100", "199", "200", "249", "250", "255", "256",
		"260", "299", "300", "999", "1000", "a"}
	for _, a := range fields {
		for _, b := range fields {
			for _, c := range fields {
				for _, d := range fields {
					s := a + "." + b + "." + c + "." + d
					want := 0
					if isIPv4(s) {
						want = len(s)
					}
					if n := dottedQuadPrefix(s); n != want {
						t.Fatalf("dottedQuadPrefix(%q) = %d, want %d", s, n, want)
					}
					if n := dottedQuadPrefix(s + ":80"); n != want {
						t.Fatalf("dottedQuadPrefix(%q) = %d, want %d", s+":80", n, want)
					}
				}
			}
		}
	}
	for _, s := range []string{"1.2.3.4.5", "1.2.3", "1.2.3.4.", ".1.2.3.4", "1.2.3.04"} {
		if n := dottedQuadPrefix(s); n != 0 {
			t.Errorf("dottedQuadPrefix(%q) = %d, want 0", s, n)
		}
	}
}
