package rlqs

import (
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// SetPolicies replaces the policies whole (as rls.Service.SetPolicies).
// Every open stream is told to abandon its buckets that had a limit and
// have none under the new policies (their policy or domain was deleted):
// Envoy drops them, and a later request starts a new bucket, which the new
// policies answer.
func (s *Service) SetPolicies(p *policy.Set) {
	if p == nil {
		p, _ = policy.NewSet()
	}
	s.policies.Store(p)
	s.mu.Lock()
	streams := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	for _, st := range streams {
		resp, keys := s.abandoned(st, p)
		if resp == nil {
			continue
		}
		if err := st.send(resp); err != nil {
			s.log.Debug("rlqs: cannot send abandon_action", "error", err.Error())
		}
		s.release(st, keys, time.Time{})
	}
}

// abandoned removes from st the buckets that lost their limit under p, and
// returns the abandon actions to send (nil when none) and the buckets'
// demand keys.
func (s *Service) abandoned(st *stream, p *policy.Set) (*rlqspb.RateLimitQuotaResponse, []string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var resp *rlqspb.RateLimitQuotaResponse
	var keys []string
	var bytes int64
	defer func() { s.budget.release(st.client, bytes) }()
	dom := p.Domain(st.domain)
	for key, b := range st.buckets {
		if !b.hadLimit {
			continue
		}
		if limits, _ := counted(dom, b.entries); len(limits) > 0 {
			continue
		}
		if resp == nil {
			resp = &rlqspb.RateLimitQuotaResponse{}
		}
		resp.BucketAction = append(resp.BucketAction, &rlqspb.RateLimitQuotaResponse_BucketAction{
			BucketId: idOf(b.entries),
			BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
				AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
			},
		})
		s.m.actions.WithLabelValues("abandon").Inc()
		if b.demandKey != "" {
			keys = append(keys, b.demandKey)
		}
		delete(st.buckets, key)
		bytes += b.cost
	}
	return resp, keys
}

// Policies returns the policies in force.
func (s *Service) Policies() *policy.Set { return s.policies.Load() }
