package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/e2e/host"
)

// GatewayConfig configures a Gateway.
type GatewayConfig struct {
	// Addr is the HTTP listen address; "127.0.0.1:0" (the default) picks a
	// free port.
	Addr string
	// AdminAddr, when set, serves the filter's metrics in the Prometheus
	// text format at /stats/prometheus (Envoy's admin path).
	AdminAddr string
	// Wasm is filter.wasm's bytes.
	Wasm []byte
	// Plugin is the filter's plugin configuration (JSON).
	Plugin []byte
	// Workers is the number of VMs (default 2).
	Workers int
	// ControlPlane is the control plane's gRPC address (host:port), served
	// as the cluster named Cluster.
	ControlPlane string
	// Cluster is the cluster name in the plugin configuration (default
	// DefaultCluster).
	Cluster string
	// Upstream is the URL requests that pass are forwarded to.
	Upstream string
	// CacheDir, when set, keeps wazero's compiled code so later gateways
	// start without compiling filter.wasm again.
	CacheDir string
	// LogLevel is the guest's log level (default "warn").
	LogLevel string
	// Logger receives the host's and the filter's log lines (default: none).
	Logger *slog.Logger
}

// Gateway is filter.wasm running in the proxy-wasm host in front of an
// upstream, serving HTTP on a loopback listener.
type Gateway struct {
	// Host is the proxy-wasm host: its metrics are the filter's.
	Host  *host.Host
	srv   *http.Server
	ln    net.Listener
	admin *http.Server
	aln   net.Listener
}

// StartGateway loads filter.wasm with the plugin configuration (the host
// refuses a configuration the filter rejects, with the filter's log line in
// the error) and serves on cfg.Addr.
func StartGateway(ctx context.Context, cfg GatewayConfig) (*Gateway, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Cluster == "" {
		cfg.Cluster = DefaultCluster
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := host.New(ctx, host.Config{
		Wasm:                cfg.Wasm,
		PluginConfig:        cfg.Plugin,
		Workers:             cfg.Workers,
		Clusters:            map[string]string{cfg.Cluster: cfg.ControlPlane},
		CompilationCacheDir: cfg.CacheDir,
		LogLevel:            cfg.LogLevel,
		Logger:              cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	g := &Gateway{Host: h}
	fail := func(err error) (*Gateway, error) {
		g.Close(context.Background())
		return nil, err
	}
	p, err := host.NewProxy(h, cfg.Upstream)
	if err != nil {
		return fail(err)
	}
	if g.ln, err = net.Listen("tcp", cfg.Addr); err != nil {
		return fail(fmt.Errorf("gateway: listen on %s: %w", cfg.Addr, err))
	}
	g.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go g.srv.Serve(g.ln)
	if cfg.AdminAddr != "" {
		if g.aln, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			return fail(fmt.Errorf("gateway: admin listen on %s: %w", cfg.AdminAddr, err))
		}
		mux := http.NewServeMux()
		mux.Handle("GET /stats/prometheus", h.MetricsHandler())
		g.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go g.admin.Serve(g.aln)
	}
	return g, nil
}

// URL returns the gateway's base URL, http://127.0.0.1:port.
func (g *Gateway) URL() string { return "http://" + g.ln.Addr().String() }

// Addr returns the gateway's listen address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// MetricsURL returns the admin URL of the filter's metrics, or "" without an
// admin listener.
func (g *Gateway) MetricsURL() string {
	if g.aln == nil {
		return ""
	}
	return "http://" + g.aln.Addr().String() + "/stats/prometheus"
}

// Counter returns the value of one of the filter's counters (0 if the filter
// never defined it).
func (g *Gateway) Counter(name string) int64 {
	m, ok := g.Host.Metric(name)
	if !ok {
		return 0
	}
	return m.Value
}

// Close stops serving (waiting up to ctx for requests in progress), then
// shuts the VMs down.
func (g *Gateway) Close(ctx context.Context) error {
	var errs []error
	for _, s := range []*http.Server{g.srv, g.admin} {
		if s == nil {
			continue
		}
		if err := s.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.Close()
			errs = append(errs, err)
		}
	}
	if g.Host != nil {
		errs = append(errs, g.Host.Close(ctx))
	}
	return errors.Join(errs...)
}
