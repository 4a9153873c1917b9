// Settlements: usage charged, or refunded, at the end of a stream by
// sluice's filter (docs/usage-based.md "Settlements from sluice's filter").

package rls

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/controlplane/store"
)

// SettleHeader is the request header that makes a ShouldRateLimit call a
// settlement: every descriptor's own hits_addend is charged, past the limit
// if need be, or, on a descriptor with is_negative_hits, given back (a
// refund: usage reserved and not used), each at most once per (token,
// descriptor index) within the store's dedupe TTL. Its value is the
// batch's token, reused on every retry. Each descriptor's status is a probe
// of its key after the charge or refund: OVER_LIMIT while a request of 1
// would be refused (a refund's status is OK, as on any call), with its
// remaining and duration_until_reset; a filter that sees a refunded
// descriptor with something remaining may forget that it was over limit.
const SettleHeader = "x-sluice-settle"

// Bounds of a settlement.
const (
	// MaxSettleDescriptors bounds the descriptors of one settlement.
	MaxSettleDescriptors = 64
	// MaxSettleToken bounds a settlement token's bytes.
	MaxSettleToken = 64
)

// Reasons for refusing a settlement (the Invalid label).
const (
	reasonBadSettleToken = "bad_settle_token"
	reasonTooManySettled = "too_many_settle_descriptors"
)

// The labels of sluice_settlements_total, and what joins a token and a
// descriptor's index into its store.Once token.
const (
	settleApplied        = "applied"
	settleDuplicate      = "duplicate"
	settleTokenSeparator = "/"
)

// validSettleToken reports whether tok is 1 to MaxSettleToken bytes of
// [A-Za-z0-9._-].
func validSettleToken(tok string) bool {
	if len(tok) == 0 || len(tok) > MaxSettleToken {
		return false
	}
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// checkSettle checks a call's x-sluice-settle values (nil: not a
// settlement) against a request of n descriptors: the token, or an
// InvalidArgument error.
func (s *Service) checkSettle(values []string, n int) (string, error) {
	switch {
	case len(values) > 1:
		return "", s.invalid(reasonBadSettleToken, "%s: sent %d times, want once", SettleHeader, len(values))
	case !validSettleToken(values[0]):
		return "", s.invalid(reasonBadSettleToken, "%s: %q is not 1 to %d bytes of [A-Za-z0-9._-]", SettleHeader, values[0], MaxSettleToken)
	case n > MaxSettleDescriptors:
		return "", s.invalid(reasonTooManySettled, "descriptors: %d in one settlement, more than the %d allowed", n, MaxSettleDescriptors)
	}
	return values[0], nil
}

// settleCost returns the store check of one limit of a settled descriptor
// of cost cost: a charge (whatever the limit's charge_past_limit), or a
// probe for a cost of 0, which charges nothing.
func settleCost(cost int64) (int64, store.Mode) {
	if cost == 0 {
		return 0, store.Probe
	}
	return cost, store.Charge
}

// attachOnce gives every charge and refund of a settlement its store.Once:
// the token and the descriptor's index, so that a retried batch applies
// nothing twice and two charges (or a charge and a refund) of one batch on
// one key are two.
func attachOnce(token string, checks []store.Check, slots []slot) []store.Once {
	onces := make([]store.Once, len(checks)) // not pooled: a store that gave up may still write them
	for k := range checks {
		if checks[k].Mode == store.Charge || checks[k].Mode == store.Refund {
			onces[k].Token = token + settleTokenSeparator + strconv.Itoa(slots[k].desc)
			checks[k].Once = &onces[k]
		}
	}
	return onces
}

// takeTokens takes the new tokens of settlement p (one a charge) from the
// budget of its client (ctx's peer), or refuses it with RESOURCE_EXHAUSTED,
// counted, after releasing p's scratch. A decision takes nothing.
func (s *Service) takeTokens(ctx context.Context, p *pending) error {
	k := int64(0)
	for i := range p.onces {
		if p.onces[i].Token != "" {
			k++
		}
	}
	if k == 0 {
		return nil
	}
	g, reason, err := s.tokens.take(settleClient(ctx), k, time.Now().UnixNano())
	if err != nil {
		s.metrics.SettleRefused.WithLabelValues(reason).Inc()
		putScratch(p.sc)
		return err
	}
	p.grant = g
	return nil
}

// countSettled counts a settlement's descriptors in
// sluice_settlements_total: applied when any of its charges (or refunds)
// was applied, duplicate when all were duplicates. Descriptors that charged
// nothing (no limit, a cost of 0) are not counted.
func (s *Service) countSettled(p *pending) {
	const duplicate, applied = 1, 2
	state := make([]uint8, p.n) // per descriptor
	dups := int64(0)
	for k := range p.onces {
		switch o := &p.onces[k]; {
		case o.Token == "":
		case o.Duplicate:
			dups++
		}
		switch o := &p.onces[k]; {
		case o.Token == "":
		case !o.Duplicate:
			state[p.sc.slots[k].desc] = applied
		case state[p.sc.slots[k].desc] == 0:
			state[p.sc.slots[k].desc] = duplicate
		}
	}
	var n [3]int
	for _, st := range state {
		n[st]++
	}
	s.metrics.Settlements.WithLabelValues(settleApplied).Add(float64(n[applied]))
	s.metrics.Settlements.WithLabelValues(settleDuplicate).Add(float64(n[duplicate]))
	s.tokens.give(p.grant, dups) // the store kept nothing new for them
}

// errSettleUndecided answers a settlement that no store could decide:
// UNAVAILABLE, never a failure mode's OK, so that the filter keeps the
// charge and sends it again under the same token (which dedupes it if a
// store did apply it before failing).
var errSettleUndecided = status.Error(codes.Unavailable, "sluice: no store could decide the settlement; send it again with the same x-sluice-settle token")
