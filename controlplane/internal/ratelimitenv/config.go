package ratelimitenv

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/controlplane/calendar"
	"github.com/sluicehq/sluice/controlplane/internal/policyservice"
	"github.com/sluicehq/sluice/controlplane/internal/rlqs"
	"github.com/sluicehq/sluice/controlplane/internal/server"
	"github.com/sluicehq/sluice/controlplane/internal/xdsconfig"
	"github.com/sluicehq/sluice/controlplane/policy"
	redisstore "github.com/sluicehq/sluice/controlplane/store/redis"
	"github.com/sluicehq/sluice/internal/tlsfiles"
)

// Endpoints are envoyproxy/ratelimit's HTTP listeners beside the metrics
// one: /healthcheck on HOST:PORT, answering as ready says (with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, also not before loaded does),
// and /rlconfig on DEBUG_HOST:DEBUG_PORT, every domain of current with its
// owner. The functions are called per request, once the server runs.
func (e *Env) Endpoints(ready func() (bool, string), loaded func() bool, current func() *policy.Set, owner func(domain string) string) []server.HTTPEndpoint {
	return []server.HTTPEndpoint{
		{Name: "healthcheck", Addr: addr(e.host, e.port), Handler: healthHandler(func() (bool, string) {
			ok, why := ready()
			if ok && e.healthyWithConfig && !loaded() {
				return false, "no rate limit configuration loaded yet"
			}
			return ok, why
		})},
		{Name: "debug", Addr: addr(e.debugHost, e.debugPort), Handler: debugHandler(current, owner)},
	}
}

// Config maps the environment to the server's configuration: the listeners
// (GRPC_*, PROMETHEUS_ADDR; the policy service on $SLUICE_POLICY_ADDR with
// $SLUICE_TOKEN), Redis (REDIS_*), NEAR_LIMIT_RATIO and, with xDS, the
// overlay's owner, and USE_CALENDAR_MONTH_RATE_LIMIT. What the environment leaves out takes sluice's defaults.
// The caller adds the policies, the tracer and the endpoints.
func (e *Env) Config(log *slog.Logger) (server.Config, error) {
	mode, addrs, master, err := e.redis()
	if err != nil {
		return server.Config{}, err
	}
	if mode == "memory" {
		log.Warn("no REDIS_URL: counters live in this process's memory store (one replica's view)")
	}
	user, password := e.redisUser()
	var redisTLS *redisstore.TLS
	if e.redisTLS || e.redisCert != "" || e.redCA != "" {
		redisTLS = &redisstore.TLS{CAFile: e.redCA, CertFile: e.redisCert, KeyFile: e.redisKey}
	}
	var grpcTLS *tls.Config
	if e.grpcTLS {
		if grpcTLS, err = server.DecisionTLSConfig(e.grpcCert, e.grpcKey, e.clientCA()); err != nil {
			return server.Config{}, err
		}
		if e.grpcSAN != "" && e.clientCA() != "" {
			server.RequireClientSAN(grpcTLS, e.grpcSAN)
		}
		if ca := e.clientCA(); ca != "" {
			log.Info("decision port: mutual TLS, client certificates checked against "+ca, "GRPC_CLIENT_TLS_CACERT", e.grpcClientCA, "GRPC_SERVER_TLS_CA_CERT", e.grpcServerCA)
		}
	}
	httpAddr := "127.0.0.1:0"
	if e.usePrometheus {
		httpAddr = e.prometheusAddr
	}
	var auth policyservice.AuthConfig
	if e.getenv(policyservice.DefaultTokenEnv) != "" {
		if auth.Tokens, err = policyservice.LoadTokens("", policyservice.DefaultTokenEnv); err != nil {
			return server.Config{}, err
		}
	}
	cfg := server.Config{
		GRPCAddr: addr(e.grpcHost, e.grpcPort),
		GRPCTLS:  grpcTLS,
		HTTPAddr: httpAddr,
		Redis: server.RedisConfig{Mode: mode, Addrs: addrs, MasterName: master, Username: user, Password: password,
			TLS: redisTLS},
		PolicyAddr:     orEnv(e.getenv, "SLUICE_POLICY_ADDR", server.DefaultPolicyAddr),
		PolicyAuth:     auth,
		NearLimitRatio: e.nearLimitRatio,
		Logger:         log,
		RLQS:           rlqs.Options{},
	}
	if e.calendarMonths {
		// MONTH limits count UTC calendar months, as envoyproxy/ratelimit's
		// cache keys then do (see rls.Options.CalendarMonths).
		if cfg.CalendarMonths, err = calendar.Of("UTC", algorithms.UnitMonth); err != nil {
			return server.Config{}, err
		}
	}
	if e.configType == configTypeXDS {
		cfg.OverlayOwner = "the xDS server " + e.xds.serverURL + " (CONFIG_TYPE=GRPC_XDS_SOTW)"
	}
	return cfg, nil
}

// XDSClient builds the xDS configuration source from CONFIG_GRPC_XDS_*: it
// hands each configuration to apply (the server's SetOverlay) and registers
// its metrics with reg.
func (e *Env) XDSClient(apply func(*policy.Set), reg prometheus.Registerer, log *slog.Logger) (*xdsconfig.Client, error) {
	x := e.xds
	var tc *tls.Config
	if x.useTLS {
		tc = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.san}
		if x.ca != "" {
			pool, err := tlsfiles.CertPool(x.ca)
			if err != nil {
				return nil, fmt.Errorf("$CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
			}
			tc.RootCAs = pool
		}
		if x.cert != "" {
			pair, err := tlsfiles.LoadKeyPair(x.cert, x.key)
			if err != nil {
				return nil, fmt.Errorf("$CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY: %w", err)
			}
			tc.GetClientCertificate = pair.GetClientCertificate
		}
	}
	return xdsconfig.New(xdsconfig.Options{
		ServerURL: x.serverURL, NodeID: x.nodeID, NodeMetadata: x.nodeMetadata, Headers: x.headers,
		TLS: tc, Backoff: x.backoff, MaxMsgSize: x.maxMsgSize,
		Apply: apply, Logger: log, Registerer: reg,
	})
}

// healthHandler serves /healthcheck as envoyproxy/ratelimit does: 200 "OK"
// while serving, 500 while starting, draining or otherwise not ready.
func healthHandler(ready func() (bool, string)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready(); !ok {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, why+"\n")
			return
		}
		io.WriteString(w, "OK")
	})
	return mux
}

// debugHandler serves /rlconfig: every domain in force, as policy YAML,
// each after a comment naming its owner (owner: the policy file, or
// xds:<resource>; "" is the policy store's, changed with ratectl).
func debugHandler(current func() *policy.Set, owner func(domain string) string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, d := range current().Domains() {
			o := owner(d.Name)
			if o == "" {
				o = "the policy store (ratectl)"
			}
			y, err := policy.Marshal(d)
			if err != nil {
				fmt.Fprintf(w, "# domain %q, owner %s: %v\n", d.Name, o, err)
				continue
			}
			fmt.Fprintf(w, "# domain %q, owner %s\n---\n%s", d.Name, o, y)
		}
	})
	return mux
}

func orEnv(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}
