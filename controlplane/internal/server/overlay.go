package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/controlplane/internal/connbounds"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// policySet is the set the decision service enforces: the policy store's
// domains, with the overlay's (xDS-owned) domains in place of any of the
// same name.
type policySet struct {
	setMu    sync.Mutex
	storeSet *policy.Set // the policy store's latest snapshot
	overlay  *policy.Set // the overlay's latest set; nil before the first
	shadowed []string    // store domains the overlay hides, last logged
}

// SetOverlay replaces the overlay's domains (Config.OverlayOwner's) with
// set, at once, and serves them in place of the policy store's domains of
// the same names. A nil set is an empty one.
func (s *Server) SetOverlay(set *policy.Set) {
	if set == nil {
		set, _ = policy.NewSet()
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	s.overlay = set
	s.enforceLocked(s.cfg.OverlayOwner)
}

// setStoreSet is called with each new policy store snapshot; attrs go on
// the "policies in force" log line.
func (s *Server) setStoreSet(set *policy.Set, cause string, attrs ...any) {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	s.storeSet = set
	s.enforceLocked(cause, attrs...)
}

// enforceLocked hands the merged set to the decision services and logs it,
// with attrs.
func (s *Server) enforceLocked(cause string, attrs ...any) {
	set, shadowed := mergeOverlay(s.storeSet, s.overlay)
	s.service.SetPolicies(set)
	if s.rlqs != nil {
		s.rlqs.svc.SetPolicies(set)
	}
	if len(shadowed) > 0 && !slices.Equal(shadowed, s.shadowed) {
		s.log.Warn("policy store domains hidden by the domains of "+s.cfg.OverlayOwner+", which win",
			"domains", strings.Join(shadowed, ","))
	}
	s.shadowed = shadowed
	s.log.Info("policies in force", append([]any{"cause", cause, "domains", strings.Join(domainNames(set), ",")}, attrs...)...)
}

// mergeOverlay returns base with overlay's domains in place of base's of
// the same name, and the names of base's domains so hidden (sorted).
func mergeOverlay(base, overlay *policy.Set) (*policy.Set, []string) {
	if overlay == nil {
		return base, nil
	}
	out := overlay
	var shadowed []string
	for _, d := range base.Domains() {
		if overlay.Domain(d.Name) != nil {
			shadowed = append(shadowed, d.Name)
			continue
		}
		out = out.With(d)
	}
	return out, shadowed
}

// overlayOwner is the policy store's Owner: for a domain the overlay holds
// now, its resource (the domain's Source, "xds:<resource>") and the
// overlay's owner.
func (s *Server) overlayOwner(domain string) string {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if d := s.overlay.Domain(domain); d != nil {
		return d.Source + " from " + s.cfg.OverlayOwner
	}
	return ""
}

// overlaySet returns the overlay's domains (nil before the first).
func (s *Server) overlaySet() *policy.Set {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	return s.overlay
}

// Owner names what owns a domain in force: the overlay's resource
// ("xds:<resource>"), the policy file that owns it, or "" for the policy
// store (ratectl).
func (s *Server) Owner(domain string) string {
	if d := s.overlaySet().Domain(domain); d != nil {
		return d.Source
	}
	if p := s.policies.Current().Policy(domain); p != nil {
		return p.Owner
	}
	return ""
}

// extraHTTP is one of Config.ExtraHTTP, opened.
type extraHTTP struct {
	name string
	ln   net.Listener
	srv  *http.Server
}

// buildExtraHTTP opens Config.ExtraHTTP's listeners with the metrics
// listener's bounds.
func (s *Server) buildExtraHTTP() error {
	for _, e := range s.cfg.ExtraHTTP {
		ln, err := net.Listen("tcp", e.Addr)
		if err != nil {
			return fmt.Errorf("server: %s address %s: %w", e.Name, e.Addr, err)
		}
		first := s.cfg.listenerBounds().FirstCallTimeout
		l := s.evicting(s.limit(ln, e.Name, connbounds.OperatorMaxConns), e.Name, first, first)
		s.extra = append(s.extra, extraHTTP{name: e.Name, ln: l, srv: s.httpServer(e.Handler)})
	}
	return nil
}

// serveExtraHTTP serves them; a failure ends Run through errc.
func (s *Server) serveExtraHTTP(errc chan<- error) {
	for _, e := range s.extra {
		go func() {
			if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("server: %s: %w", e.name, err)
			}
		}()
	}
}

// ExtraHTTPAddr returns the address of the Config.ExtraHTTP listener
// named name, or "".
func (s *Server) ExtraHTTPAddr(name string) string {
	for _, e := range s.extra {
		if e.name == name {
			return e.ln.Addr().String()
		}
	}
	return ""
}
