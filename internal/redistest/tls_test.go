package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testcerts"
)

// tlsOf returns the WithTLS option for the server certificate of certs.
func tlsOf(certs *testcerts.Set) Option {
	return WithTLS(TLS{CAFile: certs.CA.File, CertFile: certs.ServerCert, KeyFile: certs.ServerKey})
}

func TestTLS(t *testing.T) {
	ctx := context.Background()
	certs := testcerts.New(t)
	s := StartServer(t, tlsOf(certs))

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: certs.ClientTLS(t), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS with the client certificate: %v", err)
	}
	plain := newClient(t, s.Addr())
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("PING in plaintext on the TLS port succeeded")
	}
	if s.TLSConfig() == nil {
		t.Error("TLSConfig() = nil for a TLS server")
	}

	t.Run("sentinel", func(t *testing.T) {
		sen := StartSentinel(t, "tlsmaster", s, tlsOf(certs))
		fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "tlsmaster", SentinelAddrs: []string{sen.Addr()},
			TLSConfig: certs.ClientTLS(t), MaxRetries: -1, DialTimeout: time.Second})
		defer fc.Close()
		if err := fc.Set(ctx, "k", "through sentinel", 0).Err(); err != nil {
			t.Fatalf("SET through the Sentinel over TLS: %v", err)
		}
		if got := c.Get(ctx, "k").Val(); got != "through sentinel" {
			t.Errorf("GET on the master = %q", got)
		}
		// The Sentinel reaches the master over TLS: it is connected, and it has the master's run ID,
		// which it learns from INFO.
		sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr(), TLSConfig: certs.ClientTLS(t), MaxRetries: -1})
		defer sc.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			m, err := sc.Master(ctx, "tlsmaster").Result()
			if err == nil && m["flags"] == "master" && m["runid"] != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the Sentinel has no INFO from the master over TLS: %v %v", m, err)
			}
			time.Sleep(50 * time.Millisecond) // waiting for a real process
		}
	})

	t.Run("cluster", func(t *testing.T) {
		cl := StartCluster(t, 3, tlsOf(certs))
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()[:1], TLSConfig: certs.ClientTLS(t), MaxRedirects: 3, DialTimeout: time.Second})
		defer cc.Close()
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
				t.Fatalf("SET %s on the TLS cluster: %v", k, err)
			}
		}
		n := 0
		cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n++
			return m.Ping(ctx).Err()
		})
		if n != 3 {
			t.Errorf("ForEachMaster saw %d masters, want 3", n)
		}
	})
}
