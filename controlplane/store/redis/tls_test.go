package redisstore

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/store"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcerts"
)

// tlsServer returns the redistest option that serves the server certificate of certs.
func tlsServer(certs *testcerts.Set) redistest.Option {
	return redistest.WithTLS(redistest.TLS{CAFile: certs.CA.File, CertFile: certs.ServerCert, KeyFile: certs.ServerKey})
}

// tlsDialer returns TLS.Dialer's results, failing the test on error.
func tlsDialer(t *testing.T, cfg TLS) (func(context.Context, string, string) (net.Conn, error), *tls.Config) {
	t.Helper()
	d, c, err := cfg.Dialer(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return d, c
}

// decideThree decides three requests against a limit of two on key and
// checks that the third is refused: the store works through the client.
func decideThree(t *testing.T, client redis.UniversalClient, key string) {
	t.Helper()
	s := newStore(t, client, Options{})
	lim := store.Limit{Algorithm: algorithms.KindFixedWindow, Requests: 2, Window: time.Minute}
	var allowed []bool
	for range 3 {
		out := make([]algorithms.Result, 1)
		if err := s.Decide(context.Background(), []store.Check{{Key: key, Limit: lim, Cost: 1}}, out); err != nil {
			t.Fatalf("Decide over TLS: %v", err)
		}
		allowed = append(allowed, out[0].Allowed)
	}
	if !allowed[0] || !allowed[1] || allowed[2] {
		t.Errorf("allowed = %v, want [true true false]", allowed)
	}
}

func TestTLS(t *testing.T) {
	ctx := context.Background()
	certs := testcerts.New(t)
	srv := redistest.StartServer(t, tlsServer(certs))
	other := testcerts.NewCA(t) // a CA the server does not know
	otherCert, otherKey := other.Issue(t, "stranger", false)
	plain := redistest.StartServer(t)

	client := func(t *testing.T, addr string, cfg TLS) *redis.Client {
		d, tc := tlsDialer(t, cfg)
		c := redis.NewClient(&redis.Options{Addr: addr, Dialer: d, TLSConfig: tc, MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	good := TLS{CAFile: certs.CA.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}

	t.Run("decides", func(t *testing.T) {
		decideThree(t, client(t, srv.Addr(), good), "sluice:{tls}")
	})
	t.Run("server name", func(t *testing.T) {
		cfg := good
		cfg.ServerName = "sluice.test"
		if err := client(t, srv.Addr(), cfg).Ping(ctx).Err(); err != nil {
			t.Errorf("PING with a server name the certificate holds: %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		addr string
		cfg  TLS
		want []string // in the error
	}{
		{"wrong CA", srv.Addr(), TLS{CAFile: other.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey},
			[]string{"dial tcp " + srv.Addr() + ": redis TLS handshake: ", "x509: certificate signed by unknown authority", "-redis-tls-ca"}},
		{"no client certificate", srv.Addr(), TLS{CAFile: certs.CA.File},
			[]string{"certificate required", "refused the client certificate", "-redis-tls-cert"}},
		{"client certificate of another CA", srv.Addr(), TLS{CAFile: certs.CA.File, CertFile: otherCert, KeyFile: otherKey},
			[]string{"remote error: tls:", "refused the client certificate"}},
		{"wrong server name", srv.Addr(), TLS{CAFile: certs.CA.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey, ServerName: "wrong.test"},
			[]string{"wrong.test", "-redis-tls-server-name"}},
		{"plaintext server", plain.Addr(), good,
			[]string{"redis TLS handshake", "tls-port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := client(t, tc.addr, tc.cfg).Ping(ctx).Err()
			if err == nil {
				t.Fatal("PING succeeded")
			}
			t.Logf("error: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	t.Run("sentinel", func(t *testing.T) {
		sen := redistest.StartSentinel(t, "sluice", srv, tlsServer(certs))
		d, tc := tlsDialer(t, good)
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "sluice", SentinelAddrs: []string{sen.Addr()},
			Dialer: d, TLSConfig: tc, MaxRetries: -1, DialTimeout: 2 * time.Second})
		defer c.Close()
		decideThree(t, c, "sluice:{tls-sentinel}")

		// A wrong CA fails at the sentinel already.
		d, tc = tlsDialer(t, TLS{CAFile: other.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey})
		bad := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "sluice", SentinelAddrs: []string{sen.Addr()},
			Dialer: d, TLSConfig: tc, MaxRetries: -1, DialTimeout: 2 * time.Second})
		defer bad.Close()
		if err := bad.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "-redis-tls-ca") {
			t.Errorf("PING through a sentinel with a wrong CA: %v, want the CA hint", err)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3, tlsServer(certs))
		d, tc := tlsDialer(t, good)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()[:1], Dialer: d, TLSConfig: tc, DialTimeout: 2 * time.Second})
		defer c.Close()
		// Keys on every master: the client follows the cluster's TLS ports.
		for _, k := range []string{"sluice:{a}", "sluice:{b}", "sluice:{c}", "sluice:{d}"} {
			decideThree(t, c, k)
		}
		masters := 0
		if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			masters++
			return m.Ping(ctx).Err()
		}); err != nil || masters != 3 {
			t.Errorf("ForEachMaster: %d masters, %v; want 3, nil", masters, err)
		}
	})
}

func TestTLSDialerConfig(t *testing.T) {
	certs := testcerts.New(t)
	for _, tc := range []struct {
		name string
		cfg  TLS
		want string
	}{
		{"missing CA file", TLS{CAFile: certs.CA.File + ".missing"}, "CA file"},
		{"not a CA file", TLS{CAFile: certs.ClientKey}, "no PEM certificate"},
		{"cert without key", TLS{CertFile: certs.ClientCert}, "go together"},
		{"key of another cert", TLS{CertFile: certs.ClientCert, KeyFile: certs.ServerKey}, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.cfg.Dialer(time.Second)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dialer: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, _, err := (TLS{}).Dialer(0); err == nil {
		t.Error("Dialer(0): no error")
	}
}
