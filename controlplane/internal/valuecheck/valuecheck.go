// Package valuecheck checks configuration values that parse but cannot
// work: NaN, an address no listener or dialer takes, a header gRPC refuses
// to send. Each check returns "" for a good value, else why not, for an
// error that names the flag or variable. The flags of sluice-controlplane
// and envoyproxy/ratelimit's environment (package ratelimitenv) use them:
// refusing such a value at the start (exit status 2) beats a process that
// serves without what was asked for, or retries for ever.
package valuecheck

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Ratio says why x is not a finite number in [lo, hi] (above lo
// when openLo).
func Ratio(x, lo, hi float64, openLo bool) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "not a finite number"
	case openLo && x <= lo:
		return fmt.Sprintf("use a number above %v, at most %v", lo, hi)
	case x < lo || x > hi:
		return fmt.Sprintf("use a number from %v to %v", lo, hi)
	}
	return ""
}

// Host says why host is neither empty (every interface, when
// emptyOK), an IP address nor a DNS name.
func Host(host string, emptyOK bool) string {
	switch {
	case host == "":
		if emptyOK {
			return ""
		}
		return "no host"
	case strings.ContainsRune(host, ':') || strings.ContainsRune(host, '%'):
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Sprintf("%q is not an IP address", host)
		}
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if len(host) > 253 {
		return "a host name of more than 253 bytes"
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 {
			return fmt.Sprintf("%q is not a host name (empty label, or one longer than 63 bytes)", host)
		}
		for i := 0; i < len(label); i++ {
			switch c := label[i]; {
			case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			default:
				return fmt.Sprintf("%q is not a host name or an IP address", host)
			}
		}
	}
	return ""
}

// Port says why p is not a port number: 1 to 65535, or 0 (any free
// port, for a listener) when zeroOK.
func Port(p string, zeroOK bool) string {
	n, err := strconv.Atoi(p)
	switch {
	case err != nil:
		return fmt.Sprintf("port %q is not a number", p)
	case n < 0 || n > 65535 || (n == 0 && !zeroOK):
		return fmt.Sprintf("port %d is out of range (1 to 65535)", n)
	}
	return ""
}

// ListenAddr says why a is not host:port for a listener (the host
// may be empty; the port may be 0).
func ListenAddr(a string) string {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Sprintf("not host:port (%v)", strings.TrimPrefix(err.Error(), "address "+a+": "))
	}
	if p := Host(host, true); p != "" {
		return p
	}
	return Port(port, true)
}

// DialAddr says why a is not host:port to dial; with portOptional
// a bare host passes too.
func DialAddr(a string, portOptional bool) string {
	host, port, err := net.SplitHostPort(a)
	bare := !strings.Contains(a, ":") || strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]")
	switch {
	case err != nil && portOptional && bare:
		return Host(strings.Trim(a, "[]"), false)
	case err != nil:
		return fmt.Sprintf("not host:port (%v)", strings.TrimPrefix(err.Error(), "address "+a+": "))
	}
	if p := Host(host, false); p != "" {
		return p
	}
	return Port(port, false)
}

// GRPCTarget says why t is not a gRPC target sluice can dial:
// host[:port] (grpc-go's default port is 443), dns:[//authority]/host[:port],
// passthrough:///host:port, or unix:path.
func GRPCTarget(t string) string {
	scheme, rest, ok := strings.Cut(t, ":")
	switch {
	case !ok || strings.ContainsAny(scheme, ".[") || !strings.HasPrefix(rest, "/") && scheme != "unix" && scheme != "unix-abstract":
		return DialAddr(t, true) // host:port, [v6]:port or a bare host
	case scheme == "unix" || scheme == "unix-abstract":
		if strings.Trim(rest, "/") == "" {
			return "a unix target without a path"
		}
		return ""
	case scheme != "dns" && scheme != "passthrough":
		return fmt.Sprintf("scheme %q: use host:port, dns:///host:port, passthrough:///host:port or unix:path", scheme)
	}
	u, err := url.Parse(t)
	if err != nil {
		return err.Error()
	}
	return DialAddr(strings.TrimPrefix(u.Path, "/"), scheme == "dns")
}

// EndpointURL says why an OTLP endpoint is neither an http(s) URL
// with a good host and port nor a bare host:port.
func EndpointURL(e string) string {
	if !strings.Contains(e, "://") {
		return DialAddr(e, false)
	}
	u, err := url.Parse(e)
	switch {
	case err != nil:
		return err.Error()
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("scheme %q: use http or https", u.Scheme)
	}
	return DialAddr(u.Host, true)
}

// HeaderName says why name is not a gRPC metadata key a client may
// send: letters, digits, '-', '_' and '.' (grpc-go lowercases it), not one
// of gRPC's own (grpc-*).
func HeaderName(name string) string {
	if name == "" {
		return "an empty header name"
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Sprintf("header name %q: only letters, digits, '-', '_' and '.'", name)
		}
	}
	if strings.HasPrefix(strings.ToLower(name), "grpc-") {
		return fmt.Sprintf("header name %q: grpc-* headers are gRPC's own", name)
	}
	return ""
}

// HeaderValue says why v cannot be sent as the value of a text
// (not -bin) gRPC header: printable ASCII only.
func HeaderValue(name, v string) string {
	if strings.HasSuffix(strings.ToLower(name), "-bin") {
		return ""
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return fmt.Sprintf("header %q: its value holds a byte that is not printable ASCII (0x%02x at %d)", name, v[i], i)
		}
	}
	return ""
}

// Text says why s is not valid UTF-8 (protobuf strings must be).
func Text(s string) string {
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%q is not valid UTF-8", s)
	}
	return ""
}
