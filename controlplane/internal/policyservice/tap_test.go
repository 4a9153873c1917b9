package policyservice

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestRefusedBeforeTheBody: a PolicyService call without credentials is
// answered Unauthenticated as soon as its headers arrive, while its body
// has not been sent (before TapHandle, grpc-go read the whole message, up
// to a policy's 1 MiB, before the interceptor looked at the token).
func TestRefusedBeforeTheBody(t *testing.T) {
	tests := []struct {
		name, auth, want string
	}{
		{"no token", "", "16"},
		{"wrong token", "Bearer wrong-token-0123456789abcdef", "16"},
	}
	r := startReplica(t, newFileBackend(t), replicaConfig{auth: AuthConfig{Tokens: []string{"good-token-0123456789abcdef"}}})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			fr := http2.NewFramer(nc, nc)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
				t.Fatal(err)
			}
			fr.WriteSettings()
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{
				{":method", "POST"}, {":scheme", "http"}, {":authority", "x"},
				{":path", "/sluice.v1.PolicyService/Apply"}, {"content-type", "application/grpc"}, {"te", "trailers"},
			} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			if tc.auth != "" {
				enc.WriteField(hpack.HeaderField{Name: "authorization", Value: tc.auth})
			}
			// The headers only: the body (announced, never sent) would
			// be a 1 MiB policy.
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			nc.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("no answer before the body: %v", err)
				}
				if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == 1 {
					if got := h.PseudoValue("status"); got != "200" {
						t.Fatalf(":status %q", got)
					}
					for _, hf := range h.RegularFields() {
						if hf.Name == "grpc-status" {
							if hf.Value != tc.want {
								t.Fatalf("grpc-status %s, want %s", hf.Value, tc.want)
							}
							return
						}
					}
				}
			}
		})
	}
}
