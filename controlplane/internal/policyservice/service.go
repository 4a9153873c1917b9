package policyservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// maxSourceLen bounds ApplyRequest.source, which error messages quote.
const maxSourceLen = 256

// Service implements sluicev1.PolicyServiceServer.
type Service struct {
	sluicev1.UnimplementedPolicyServiceServer
	store    *policystore.Store
	log      *slog.Logger
	overlay  func() *policy.Set
	lim      Limits
	gate     gate
	applying chan struct{} // held while an Apply validates and stores
	shared   shared
}

// Options configures a Service.
type Options struct {
	// Logger receives one line per change (domain, version, who); nil
	// means slog.Default().
	Logger *slog.Logger
	// Overlay, when set, returns the domains served beside the store's and
	// in place of the store's of the same names (an xDS server's), each
	// naming its owner in its Source ("xds:<resource>"): Get and List show
	// them.
	Overlay func() *policy.Set
	// Limits bound the work in flight (zero: the defaults).
	Limits Limits
}

// New returns the service for store.
func New(store *policystore.Store, opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Overlay == nil {
		opts.Overlay = func() *policy.Set { return nil }
	}
	lim := opts.Limits.withDefaults()
	return &Service{store: store, log: opts.Logger, overlay: opts.Overlay, lim: lim,
		gate: gate{lim: lim, perConn: map[string]int{}}, applying: make(chan struct{}, 1)}
}

// Register registers the service on r (a *grpc.Server).
func (s *Service) Register(r grpc.ServiceRegistrar) {
	sluicev1.RegisterPolicyServiceServer(r, s)
}

// guard converts an optional expected version and take_over.
func guard(expected *uint64, takeOver bool) policystore.Guard {
	var g policystore.Guard
	if expected != nil {
		g = policystore.Expect(*expected)
	}
	g.TakeOver = takeOver
	return g
}

// Apply validates and stores one domain's policy, one Apply at a time: the
// largest policy costs about 130 MiB to parse, store and load back, and
// the calls that wait hold only their request (at most Limits.MaxApplies
// are admitted, TapHandle).
func (s *Service) Apply(ctx context.Context, req *sluicev1.ApplyRequest) (*sluicev1.ApplyResponse, error) {
	if err := checkSource(req.GetSource()); err != nil {
		return nil, err
	}
	select {
	case s.applying <- struct{}{}:
		defer func() { <-s.applying }()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	g := guard(req.ExpectedVersion, req.GetTakeOver())
	res, err := s.store.Apply(ctx, req.GetSource(), []byte(req.GetYaml()), g)
	if err != nil {
		return nil, statusOf(err)
	}
	s.log.Info("policy service: applied", "domain", res.Domain, "version", res.Version,
		"unchanged", res.Unchanged, "expected_version", g.String(), "by", IdentityFrom(ctx))
	return &sluicev1.ApplyResponse{Version: res.Version, Domain: res.Domain, Unchanged: res.Unchanged}, nil
}

// checkSource checks ApplyRequest.source.
func checkSource(src string) error {
	if len(src) > maxSourceLen || strings.IndexFunc(src, unicode.IsControl) >= 0 {
		return status.Errorf(codes.InvalidArgument,
			"source: at most %d bytes without control characters (it names the document in error messages, e.g. the file name)", maxSourceLen)
	}
	return nil
}

// checkDomain checks a request's domain field.
func checkDomain(domain string) error {
	if domain == "" {
		return status.Error(codes.InvalidArgument, "domain: required: name the domain (list shows them)")
	}
	return nil
}

// Get returns one domain's policy as this replica enforces it: an answer
// shared by every client (see shared).
func (s *Service) Get(ctx context.Context, req *sluicev1.GetRequest) (*sluicev1.GetResponse, error) {
	if err := checkDomain(req.GetDomain()); err != nil {
		return nil, err
	}
	uncompressed(ctx)
	snap, overlay, domain := s.store.Current(), s.overlay(), req.GetDomain()
	res := s.shared.getResponse(snap, overlay, domain, func() *sluicev1.GetResponse {
		if d := overlay.Domain(domain); d != nil {
			return &sluicev1.GetResponse{Policy: overlayProto(d), StoreVersion: snap.Version}
		}
		if p := snap.Policy(domain); p != nil {
			return &sluicev1.GetResponse{Policy: toProto(p), StoreVersion: snap.Version}
		}
		return nil
	})
	if res == nil {
		return nil, status.Errorf(codes.NotFound, "domain %q: no such domain (list shows the domains there are)", domain)
	}
	return res, nil
}

// List returns every domain's policy in force: the store's, from one
// snapshot, and the overlay's in place of the store's of the same name; an
// answer shared by every client.
func (s *Service) List(ctx context.Context, req *sluicev1.ListRequest) (*sluicev1.ListResponse, error) {
	uncompressed(ctx)
	snap, overlay := s.store.Current(), s.overlay()
	return s.shared.listResponse(snap, overlay, func() *sluicev1.ListResponse {
		out := &sluicev1.ListResponse{StoreVersion: snap.Version}
		for _, p := range snap.Policies() {
			if overlay.Domain(p.Domain) == nil {
				out.Policies = append(out.Policies, toProto(p))
			}
		}
		for _, d := range overlay.Domains() {
			out.Policies = append(out.Policies, overlayProto(d))
		}
		sort.Slice(out.Policies, func(i, j int) bool { return out.Policies[i].Domain < out.Policies[j].Domain })
		return out
	}), nil
}

// uncompressed sends the call's answers as they are: a client that asks
// for compression would get a compressed copy of the shared bytes of its
// own.
func uncompressed(ctx context.Context) {
	grpc.SetSendCompressor(ctx, encoding.Identity)
}

// overlayProto converts an overlay domain: version 0, its YAML as
// policy.Marshal writes it, its Source as the owner.
func overlayProto(d *policy.Domain) *sluicev1.Policy {
	y, err := policy.Marshal(d)
	if err != nil {
		y = []byte(fmt.Sprintf("# cannot write the policy as YAML: %v\n", err))
	}
	return &sluicev1.Policy{Domain: d.Name, Yaml: string(y), Owner: d.Source}
}

// Delete removes one domain's policy.
func (s *Service) Delete(ctx context.Context, req *sluicev1.DeleteRequest) (*sluicev1.DeleteResponse, error) {
	if err := checkDomain(req.GetDomain()); err != nil {
		return nil, err
	}
	g := guard(req.ExpectedVersion, req.GetTakeOver())
	v, err := s.store.Delete(ctx, req.GetDomain(), g)
	if err != nil {
		return nil, statusOf(err)
	}
	s.log.Info("policy service: deleted", "domain", req.GetDomain(), "store_version", v,
		"expected_version", g.String(), "by", IdentityFrom(ctx))
	return &sluicev1.DeleteResponse{StoreVersion: v}, nil
}

// Watch sends the current set, then every new version as the domains
// applied and deleted since the previous message, each message shared by
// the watchers (see shared). It ends when the client goes away, when it has
// not taken a message when the next is due Limits.WatchSendTimeout after
// it was sent, or when the store is closed (server shutdown: Unavailable).
func (s *Service) Watch(req *sluicev1.WatchRequest, stream grpc.ServerStreamingServer[sluicev1.WatchResponse]) error {
	ctx := stream.Context()
	uncompressed(ctx)
	var prev *policystore.Snapshot
	for {
		snap, err := s.store.Next(ctx, prev)
		if err != nil {
			return statusOf(err)
		}
		if msg := s.shared.watchMessage(prev, snap); msg != nil {
			if err := sendWithin(stream, msg, s.lim.WatchSendTimeout); err != nil {
				return err
			}
		}
		prev = snap
	}
}

// changes is the Watch message that takes a watcher from prev (nil: nothing
// yet) to snap, or nil when there is nothing to tell.
func changes(prev, snap *policystore.Snapshot) *sluicev1.WatchResponse {
	msg := &sluicev1.WatchResponse{StoreVersion: snap.Version, Snapshot: prev == nil}
	for _, p := range snap.Policies() {
		if old := prev.Policy(p.Domain); old == nil || old.Version != p.Version || string(old.YAML) != string(p.YAML) {
			msg.Applied = append(msg.Applied, toProto(p))
		}
	}
	for _, p := range prev.Policies() {
		if snap.Policy(p.Domain) == nil {
			msg.Deleted = append(msg.Deleted, p.Domain)
		}
	}
	if prev != nil && prev.Version == snap.Version && len(msg.Applied) == 0 && len(msg.Deleted) == 0 {
		return nil
	}
	return msg
}

// toProto converts a stored policy.
func toProto(p *policystore.Policy) *sluicev1.Policy {
	return &sluicev1.Policy{Domain: p.Domain, Version: p.Version, Yaml: string(p.YAML), Owner: p.Owner}
}

// statusOf maps a store error to a gRPC status.
func statusOf(err error) error {
	var list policy.ErrorList
	var conflict *policystore.ConflictError
	switch {
	case errors.As(err, &list):
		return status.Error(codes.InvalidArgument, "policy rejected, nothing was changed:\n"+list.Error())
	case errors.As(err, &conflict):
		return status.Error(codes.FailedPrecondition, conflict.Error())
	case errors.Is(err, policystore.ErrOwned):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, policystore.ErrNotFound):
		return status.Errorf(codes.NotFound, "%v (list shows the domains there are)", err)
	case errors.Is(err, policystore.ErrClosed):
		return status.Error(codes.Unavailable, "the control plane is shutting down: retry on another replica")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, policystore.ErrUnavailable):
		return status.Errorf(codes.Unavailable, "%v: nothing was changed; retry when the store is reachable", err)
	}
	return status.Error(codes.Internal, fmt.Sprintf("policy store: %v", err))
}
