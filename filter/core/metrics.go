package core

// Metric names (Envoy shows a proxy-wasm filter's with its "wasmcustom."
// prefix).
const (
	MetricAllowed          = "sluice.allowed"           // the control plane admitted the request
	MetricOverLimit        = "sluice.over_limit"        // the control plane denied it: 429
	MetricPrecheckRejected = "sluice.precheck_rejected" // rejected locally, without a call: 429
	MetricErrors           = "sluice.errors"            // call failed, timed out, bad answer, or panic
	MetricFailureOpen      = "sluice.failure_open"      // ... and the request went through
	MetricFailureClosed    = "sluice.failure_closed"    // ... and the request was refused

	// MetricPrecheckShared counts the precheck's rejections on a block read
	// from the per-Envoy blocks, that this worker had not learnt itself
	// (they count in sluice.precheck_rejected too).
	MetricPrecheckShared = "sluice.precheck_shared"
	// MetricSharedCASRetries counts the writes of a block that lost a race
	// to another worker's and tried again.
	MetricSharedCASRetries = "sluice.shared_cas_retries"
	// MetricSharedLost counts the blocks that stayed in this worker: every
	// attempt to share one lost, or the host refused it.
	MetricSharedLost = "sluice.shared_lost"

	MetricHeld         = "sluice.held"           // gauge: requests held now (shaping)
	MetricDelayed      = "sluice.delayed"        // requests held, then resumed
	MetricDelayedMs    = "sluice.delayed_ms"     // the milliseconds they were held, summed
	MetricHoldRejected = "sluice.hold_rejected"  // 429: the worker already held max_held requests
	MetricHoldAbandon  = "sluice.hold_abandoned" // held requests whose client went away

	// MetricQuotaAllowed counts requests admitted from a quota the control
	// plane granted in advance (RLS DescriptorStatus.quota), without a call.
	MetricQuotaAllowed = "sluice.quota_allowed"
	// MetricLeaseCASRetries counts the writes of a lease pool that lost a
	// race to another worker's and tried again.
	MetricLeaseCASRetries = "sluice.lease_cas_retries"
	// MetricLeaseExhausted counts the requests that found a unit in the
	// pool but lost every attempt to take it, and called the control plane.
	MetricLeaseExhausted = "sluice.lease_exhausted"
	// MetricLeaseLost counts the grants (and units given back) that could
	// not be stored in the pool: lost, which can only admit less.
	MetricLeaseLost = "sluice.lease_lost"
	// MetricLeaseWaited counts the requests that found their pool empty
	// and waited for a call under way for the same descriptors instead of
	// calling.
	MetricLeaseWaited = "sluice.lease_waited"
	// MetricLeaseRenewals counts the renewals sent (prefetch).
	MetricLeaseRenewals = "sluice.lease_renewals"
	// MetricLeaseRenewalsGranted counts the renewals whose answer brought
	// units into the pool.
	MetricLeaseRenewalsGranted = "sluice.lease_renewals_granted"
	// MetricLeaseRenewalLost counts the units renewals debited and could
	// not spend (an OK answer without a quota, no request waiting).
	MetricLeaseRenewalLost = "sluice.lease_renewal_lost"

	MetricUsageMissing       = "sluice.usage_missing"        // a usage-based descriptor's cost value was missing or malformed
	MetricUsageDisconnects   = "sluice.usage_disconnects"    // streams with usage-based limits whose client went away before the response ended
	MetricUsageSettled       = "sluice.usage_settled"        // charges the control plane acknowledged
	MetricUsageSettleCalls   = "sluice.usage_settle_calls"   // settle calls acknowledged
	MetricUsageSettleRetries = "sluice.usage_settle_retries" // settle calls sent again after a failure
	MetricUsageSettleLost    = "sluice.usage_settle_lost"    // charges dropped: the queue was full, or the key too long
	MetricUsageRefunds       = "sluice.usage_refunds"        // refunds queued: reserved, not used, given back
	MetricUsageRefundsLapsed = "sluice.usage_refunds_lapsed" // refunds not sent: the window the reserve was taken in had ended

	// The metrics of LLM traffic (rate limits that read the request body
	// or the answer's usage).
	MetricLLMRequestTooLarge  = "sluice.llm_request_too_large" // request bodies past llm.max_request_bytes: the default reserve
	MetricLLMRequestMalformed = "sluice.llm_request_malformed" // request bodies that were not one JSON object: the default reserve
	MetricLLMAnswerMalformed  = "sluice.llm_answer_malformed"  // JSON answers, or SSE events, that were not one complete JSON object
	MetricLLMEventsOversized  = "sluice.llm_events_oversized"  // SSE events past llm.max_event_bytes: skipped, counted as text
	MetricLLMCuts             = "sluice.llm_cuts"              // streams cut: their budget ran out
	MetricLLMDraws            = "sluice.llm_draws"             // slices a stream drew once its reserve was spent
	MetricLLMDrawsRefused     = "sluice.llm_draws_refused"     // slices refused: the key had nothing left
	MetricLLMEventsOverlong   = "sluice.llm_events_overlong"   // SSE events of a stream that may be cut, longer than llm.hold_bytes: sent as they came
)

// metric indexes the metrics of a worker.
type metric uint8

// The metrics, in groups that are defined together (see Metrics).
const (
	mAllowed metric = iota
	mOverLimit
	mPrecheckRejected
	mErrors
	mFailureOpen
	mFailureClosed
	mDelayed
	mDelayedMs
	mHoldRejected
	mHoldAbandon
	mPrecheckShared
	mSharedRetries
	mSharedLost
	mHeld // the gauge
	// defined only with usage-based limits
	mUsageSettled
	mUsageSettleCalls
	mUsageSettleRetries
	mUsageSettleLost
	mUsageMissing
	mUsageDisconnects
	mUsageRefunds
	mUsageRefundsLapsed
	// defined with LLM traffic
	mLLMRequestTooLarge
	mLLMRequestMalformed
	mLLMAnswerMalformed
	mLLMEventsOversized
	mLLMCuts
	mLLMDraws
	mLLMDrawsRefused
	mLLMEventsOverlong
	// defined on their first use
	mQuotaAllowed
	mLeaseRetries
	mLeaseExhausted
	mLeaseLost
	mLeaseWaited
	mLeaseRenewals
	mLeaseRenewalsGranted
	mLeaseRenewalLost
	numMetrics
)

// Metric describes one of the filter's metrics.
type Metric struct {
	Name string
	Kind MetricKind
}

// Metrics lists every metric the core may define, so that a host that can
// define stats only while a configuration is created can define them all
// then. A worker defines the first group at Configure, the usage metrics
// there too when a rate limit is usage-based (and the LLM ones when one
// reads LLM traffic), and the lease metrics when
// it first counts one (so that a filter without leases shows none).
var Metrics = [numMetrics]Metric{
	mAllowed: {MetricAllowed, Counter}, mOverLimit: {MetricOverLimit, Counter},
	mPrecheckRejected: {MetricPrecheckRejected, Counter}, mErrors: {MetricErrors, Counter},
	mFailureOpen: {MetricFailureOpen, Counter}, mFailureClosed: {MetricFailureClosed, Counter},
	mDelayed: {MetricDelayed, Counter}, mDelayedMs: {MetricDelayedMs, Counter},
	mHoldRejected: {MetricHoldRejected, Counter}, mHoldAbandon: {MetricHoldAbandon, Counter},
	mPrecheckShared: {MetricPrecheckShared, Counter}, mSharedRetries: {MetricSharedCASRetries, Counter},
	mSharedLost: {MetricSharedLost, Counter}, mHeld: {MetricHeld, Gauge},
	mUsageSettled: {MetricUsageSettled, Counter}, mUsageSettleCalls: {MetricUsageSettleCalls, Counter},
	mUsageSettleRetries: {MetricUsageSettleRetries, Counter}, mUsageSettleLost: {MetricUsageSettleLost, Counter},
	mUsageMissing: {MetricUsageMissing, Counter}, mUsageDisconnects: {MetricUsageDisconnects, Counter},
	mUsageRefunds: {MetricUsageRefunds, Counter}, mUsageRefundsLapsed: {MetricUsageRefundsLapsed, Counter},
	mLLMRequestTooLarge: {MetricLLMRequestTooLarge, Counter}, mLLMRequestMalformed: {MetricLLMRequestMalformed, Counter},
	mLLMAnswerMalformed: {MetricLLMAnswerMalformed, Counter}, mLLMEventsOversized: {MetricLLMEventsOversized, Counter},
	mLLMCuts: {MetricLLMCuts, Counter}, mLLMDraws: {MetricLLMDraws, Counter},
	mLLMDrawsRefused: {MetricLLMDrawsRefused, Counter}, mLLMEventsOverlong: {MetricLLMEventsOverlong, Counter},
	mQuotaAllowed: {MetricQuotaAllowed, Counter}, mLeaseRetries: {MetricLeaseCASRetries, Counter},
	mLeaseExhausted: {MetricLeaseExhausted, Counter}, mLeaseLost: {MetricLeaseLost, Counter},
	mLeaseWaited: {MetricLeaseWaited, Counter}, mLeaseRenewals: {MetricLeaseRenewals, Counter},
	mLeaseRenewalsGranted: {MetricLeaseRenewalsGranted, Counter}, mLeaseRenewalLost: {MetricLeaseRenewalLost, Counter},
}
