// Package xdsconfig takes sluice's policies from an xDS server, as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW does: an ADS stream
// (state of the world) subscribed to RateLimitConfig resources
// (TypeURL), the way Envoy Gateway configures its rate limit service.
//
// Each response is the whole set of xDS-owned domains. It is converted and
// validated (Decode) as policy files are; a valid one replaces the set at
// once and is ACKed, an invalid one is NACKed with error_detail naming each
// resource and field at fault, and the last good set keeps serving. A broken
// stream is reopened with backoff; meanwhile the last good set serves.
package xdsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// DefaultMaxMsgSize bounds one xDS response (grpc-go's client default is 4
// MiB; a policy document alone may be policy.MaxDocumentSize).
const DefaultMaxMsgSize = 16 << 20

// maxErrorDetail bounds the error_detail message of a NACK.
const maxErrorDetail = 16 << 10

// Options configures a Client.
type Options struct {
	// ServerURL is the xDS server's host:port (CONFIG_GRPC_XDS_SERVER_URL).
	ServerURL string
	// NodeID is the node id sent in every request (CONFIG_GRPC_XDS_NODE_ID);
	// Envoy Gateway serves node "envoy-ratelimit".
	NodeID string
	// NodeMetadata is the node's metadata (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are added to the stream's request metadata
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// TLS, when set, dials over TLS with it (its Certificates: mTLS; its
	// ServerName: the name the server's certificate must hold). nil:
	// plaintext.
	TLS *tls.Config
	// Backoff paces reconnections.
	Backoff Backoff
	// MaxMsgSize bounds one response; 0 means DefaultMaxMsgSize.
	MaxMsgSize int
	// Apply receives each accepted set of xDS-owned domains, in order, from
	// Run's goroutine. Required.
	Apply func(*policy.Set)
	// Logger receives the client's logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the client's metrics.
	Registerer prometheus.Registerer
}

// Client follows an xDS server's RateLimitConfig resources.
type Client struct {
	opts Options
	log  *slog.Logger
	conn *grpc.ClientConn

	mu      sync.Mutex
	version string        // the last accepted version_info
	first   chan struct{} // closed at the first accepted response
	once    sync.Once

	connected atomic.Bool
	updates   *prometheus.CounterVec

	applied   int         // descriptors and limits of the set applied last
	releasing atomic.Bool // a release is under way
}

// Thresholds of release: a response of releaseBytes or more, or a set
// that replaces one of releaseItems more descriptors and limits (the
// largest set the bounds allow holds about 60 MB).
const (
	releaseBytes = 1 << 20
	releaseItems = 2000
)

// New returns a Client; Run follows the server. It does not dial yet.
func New(opts Options) (*Client, error) {
	if opts.ServerURL == "" {
		return nil, errors.New("xdsconfig: no server URL")
	}
	if opts.Apply == nil {
		return nil, errors.New("xdsconfig: no Apply function")
	}
	if opts.MaxMsgSize <= 0 {
		opts.MaxMsgSize = DefaultMaxMsgSize
	}
	opts.Backoff = opts.Backoff.withDefaults()
	c := &Client{opts: opts, log: opts.Logger, first: make(chan struct{})}
	if c.log == nil {
		c.log = slog.Default()
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	conn, err := grpc.NewClient(opts.ServerURL,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMsgSize)))
	if err != nil {
		return nil, fmt.Errorf("xdsconfig: server %q: %w", opts.ServerURL, err)
	}
	c.conn = conn
	c.updates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_xds_responses_total",
		Help: "xDS responses received, by result: ack (applied) or nack (refused; the last good set keeps serving).",
	}, []string{"result"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(c.updates, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_xds_connected",
			Help: "1 while the xDS stream is open, else 0.",
		}, func() float64 {
			if c.connected.Load() {
				return 1
			}
			return 0
		}))
	}
	return c, nil
}

// Loaded is closed once the first response has been accepted.
func (c *Client) Loaded() <-chan struct{} { return c.first }

// Version returns the last accepted version_info ("" before the first).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Run follows the server until ctx ends: it opens the stream, applies and
// ACKs or NACKs each response, and reopens the stream with backoff when it
// fails. It returns ctx's error, and closes the connection.
func (c *Client) Run(ctx context.Context) error {
	defer c.conn.Close()
	attempt := 0
	for {
		got, err := c.stream(ctx)
		c.connected.Store(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if got {
			attempt = 0 // the stream worked: start the backoff afresh
		}
		wait := c.opts.Backoff.Delay(attempt, rand.Float64())
		attempt++
		c.log.Warn("xDS stream ended: keeping the last good configuration and reconnecting",
			"server", c.opts.ServerURL, "retry_in", wait.Round(time.Millisecond).String(), "version", c.Version(), "error", errString(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// stream runs one ADS stream; got reports whether any response came.
func (c *Client) stream(ctx context.Context) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.opts.Headers) > 0 {
		kv := make([]string, 0, 2*len(c.opts.Headers))
		for k, v := range c.opts.Headers {
			kv = append(kv, k, v)
		}
		sctx = metadata.AppendToOutgoingContext(sctx, kv...)
	}
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(c.conn)
	st, err := ads.StreamAggregatedResources(sctx, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	node, err := c.node()
	if err != nil {
		return false, err
	}
	// A new stream asks for the state of the world with no version: a
	// restarted server may reuse version strings for other contents.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL}); err != nil {
		return false, err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		if !got {
			got = true
			c.connected.Store(true)
			c.log.Info("xDS stream open", "server", c.opts.ServerURL, "node", c.opts.NodeID)
		}
		if err := st.Send(c.handle(resp, node)); err != nil {
			return got, err
		}
	}
}

// handle applies one response and returns the ACK or NACK to send.
func (c *Client) handle(resp *discoveryv3.DiscoveryResponse, node *corev3.Node) *discoveryv3.DiscoveryRequest {
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
	var set *policy.Set
	err := fmt.Errorf("type %q: this client subscribes to %s only", resp.GetTypeUrl(), TypeURL)
	if resp.GetTypeUrl() == TypeURL {
		set, err = Decode(resp.GetResources())
	}
	size := 0
	for _, r := range resp.GetResources() {
		size += len(r.GetValue())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		req.VersionInfo = c.version
		msg := err.Error()
		if len(msg) > maxErrorDetail {
			msg = msg[:maxErrorDetail] + "..."
		}
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg}
		c.updates.WithLabelValues("nack").Inc()
		c.log.Error("xDS: refused a configuration (NACK); the last good one keeps serving",
			"version", resp.GetVersionInfo(), "kept_version", c.version, "error", msg)
		if size >= releaseBytes {
			c.release()
		}
		return req
	}
	c.opts.Apply(set)
	items := setItems(set)
	if size >= releaseBytes || c.applied-items >= releaseItems {
		c.release()
	}
	c.applied = items
	c.version = resp.GetVersionInfo()
	req.VersionInfo = c.version
	c.updates.WithLabelValues("ack").Inc()
	c.once.Do(func() { close(c.first) })
	c.log.Info("xDS: configuration applied (ACK)", "version", c.version, "domains", set.Len())
	return req
}

// release returns to the system, in the background, the memory that a
// large response or a replaced large set leaves behind: at the control
// plane's GC percentage (400) the runtime would otherwise keep it until
// the heap grew five times over, and a replica that once served a large
// set would keep its RSS.
func (c *Client) release() {
	if c.releasing.CompareAndSwap(false, true) {
		go func() {
			defer c.releasing.Store(false)
			debug.FreeOSMemory()
		}()
	}
}

// setItems counts the descriptors and limits of set.
func setItems(set *policy.Set) int {
	n := 0
	for _, d := range set.Domains() {
		n += d.DescriptorCount() + len(d.Limits())
	}
	return n
}

// node is the Node sent in each request.
func (c *Client) node() (*corev3.Node, error) {
	n := &corev3.Node{Id: c.opts.NodeID}
	if len(c.opts.NodeMetadata) > 0 {
		m := make(map[string]any, len(c.opts.NodeMetadata))
		for k, v := range c.opts.NodeMetadata {
			m[k] = v
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return nil, fmt.Errorf("xdsconfig: node metadata: %w", err)
		}
		n.Metadata = s
	}
	return n, nil
}

func errString(err error) string {
	if err == nil {
		return "stream closed by the server"
	}
	return err.Error()
}
