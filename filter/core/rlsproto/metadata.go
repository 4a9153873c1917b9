package rlsproto

import "math"

// The sluice dynamic metadata contract.
//
// The control plane describes, for each descriptor of a request, the limit
// it applied, so that the filter's precheck can size its local limiter for
// any algorithm (RLS's current_limit can only say "N per unit", which fits a
// fixed window of a whole unit). It sends this in
// RateLimitResponse.dynamic_metadata (a google.protobuf.Struct):
//
//	dynamic_metadata {
//	  "sluice": [                  // ListValue, one element per descriptor, in request order
//	    {                          // Struct; {} (or a non-struct) when no limit applies
//	      "algorithm": "gcra",     // string, one of the Algorithm* constants
//	      "limit": 100,            // number, see below
//	      "window_ms": 60000,      // number, milliseconds, may be fractional
//	      "burst": 21,             // number, the capacity, see below
//	      "retry_after_ms": 1250,  // number; set when the descriptor was denied
//	      "failure_mode": "closed", // string, "open" or "closed"; see below
//	      "name": "api_key#0",     // string, the limit's name in the RateLimit headers
//	      "wait_ms": 250           // number; reserve only: wait this long, then proceed
//	    },
//	    ...
//	  ]
//	}
//
// limit is the number of requests per window (the refill rate for
// token_bucket, gcra and reserve), window_ms the window or refill period,
// and burst the capacity: the most admitted at one instant. In terms of the
// algorithms types:
//
//	fixed_window    FixedWindow{Limit: limit, Window: window_ms}        burst = limit
//	sliding_window  SlidingWindow{Limit: limit, Window: window_ms}      burst = limit
//	sliding_log     SlidingLog{Limit: limit, Window: window_ms}         burst = limit
//	token_bucket    TokenBucket{Rate: limit, Period: window_ms, Burst}  burst = Burst
//	gcra            GCRA{Count: limit, Period: window_ms, MaxBurst}     burst = MaxBurst+1
//	reserve         Reserve{Rate: limit, Period: window_ms, Burst}      burst = Burst
//
// An algorithm of "" (or an empty struct) means: do not size a local limiter
// from this descriptor (no limit, shadow mode, a failed store).
//
// retry_after_ms is algorithms.Result.RetryAfter of the denying decision:
// how long until the same request (same cost) would be allowed if nothing
// else arrived. It must not be the time until the limiter is full again
// (ResetAfter), which for token buckets and GCRA is much longer. The filter
// rounds it down, and burst and limit up: each rounding can only make its
// precheck admit more.
//
// When a descriptor has several limits, the element describes one of them:
// the one that denied the request when it was denied, otherwise any (the
// one with the least remaining is the most useful). Any limit that applies is
// a sound basis for the precheck, because a request must pass all of them.
//
// failure_mode is the effective failure mode of the limits that matched the
// descriptor ("closed" if any of them fails closed): what the filter should
// do with a request for this descriptor when it cannot ask the control
// plane. Absent (or another value) means unknown.
//
// name is what the RateLimit headers call the limit (its name in the policy,
// else its ID), so that the filter's headers name a limit as the control
// plane's do. Absent means: use current_limit.name.
//
// wait_ms, when positive, says that the descriptor is OK but its request
// must wait that long before it proceeds: the control plane reserved a slot
// for it (algorithm reserve). The request waits for the longest wait_ms of
// its descriptors. RLS has no field for a wait, so an RLS client that does
// not read this metadata (Envoy's ratelimit filter) lets the request
// through at once.
//
// A response without the "sluice" field is treated as coming from an RLS
// that only knows fixed windows (such as envoyproxy/ratelimit): the filter
// uses current_limit as a fixed window of requests_per_unit per
// unit*unit_multiplier, and duration_until_reset as the retry-after of a
// denied descriptor.
const (
	MetadataKey          = "sluice"
	MetadataAlgorithm    = "algorithm"
	MetadataLimit        = "limit"
	MetadataWindowMs     = "window_ms"
	MetadataBurst        = "burst"
	MetadataRetryAfterMs = "retry_after_ms"
	MetadataFailureMode  = "failure_mode"
	MetadataWaitMs       = "wait_ms"
	MetadataName         = "name"
)

// Failure modes used in the metadata.
const (
	FailureModeOpen   = "open"
	FailureModeClosed = "closed"
)

// Algorithm names used in the metadata.
const (
	AlgorithmFixedWindow   = "fixed_window"
	AlgorithmSlidingWindow = "sliding_window"
	AlgorithmSlidingLog    = "sliding_log"
	AlgorithmTokenBucket   = "token_bucket"
	AlgorithmGCRA          = "gcra"
	AlgorithmReserve       = "reserve"
)

// LimitInfo is one element of the sluice metadata. Numbers that were absent
// or not numbers are 0.
type LimitInfo struct {
	Algorithm    string
	Limit        float64
	WindowMs     float64
	Burst        float64
	RetryAfterMs float64
	FailureMode  string // "" when absent or not a string
	WaitMs       float64
	Name         string // "" when absent or not a string
}

// Google's well-known struct types, by field number:
// Struct{1: map<string, Value> fields}, map entry {1: key, 2: value},
// Value{2: number_value (double), 3: string_value, 5: struct_value,
// 6: list_value}, ListValue{1: repeated Value values}.

// decodeMetadata reads the sluice list out of dynamic_metadata.
func decodeMetadata(b []byte, resp *Response) error {
	r := reader{b}
	for {
		key, val, ok, err := r.structField()
		if err != nil || !ok {
			return err
		}
		if key != MetadataKey {
			continue
		}
		resp.Limits = resp.Limits[:0]
		resp.HasLimits = true
		list, ok, err := valueField(val, 6)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := decodeLimitList(list, resp); err != nil {
			return err
		}
	}
}

// structField reads the next field of an encoded google.protobuf.Struct:
// its key and its encoded Value, in wire order; ok is false at the end.
// (A loop over it costs less in filter.wasm than calling a function value
// per field.)
func (r *reader) structField() (key string, val []byte, ok bool, err error) {
	for {
		field, wire, more, err := r.next()
		if err != nil || !more {
			return "", nil, false, err
		}
		if field != 1 {
			if err := r.skip(wire); err != nil {
				return "", nil, false, err
			}
			continue
		}
		eb, err := r.bytesField(wire)
		if err != nil {
			return "", nil, false, err
		}
		key, val, err := mapEntry(eb)
		if err != nil {
			return "", nil, false, err
		}
		return key, val, true, nil
	}
}

// mapEntry splits a Struct map entry into its key and its Value message.
func mapEntry(b []byte) (key string, val []byte, err error) {
	r := reader{b}
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return key, val, err
		}
		switch field {
		case 1, 2:
			v, err := r.bytesField(wire)
			if err != nil {
				return "", nil, err
			}
			if field == 1 {
				key = str(v)
			} else {
				val = v
			}
		default:
			if err := r.skip(wire); err != nil {
				return "", nil, err
			}
		}
	}
}

// valueField returns the payload of a length-delimited member of a Value's
// oneof (3 string, 5 struct, 6 list); ok is false when another member is set.
func valueField(val []byte, want uint64) (payload []byte, ok bool, err error) {
	r := reader{val}
	for {
		field, wire, more, err := r.next()
		if err != nil || !more {
			return payload, ok, err
		}
		if field == want && wire == wireBytes {
			if payload, err = r.bytes(); err != nil {
				return nil, false, err
			}
			ok = true
			continue
		}
		if field == want {
			return nil, false, ErrMalformed
		}
		if err := r.skip(wire); err != nil {
			return nil, false, err
		}
		ok = false // the oneof's last member wins
	}
}

// numberValue returns a Value's number_value; ok is false for other kinds.
func numberValue(val []byte) (n float64, ok bool, err error) {
	r := reader{val}
	for {
		field, wire, more, err := r.next()
		if err != nil || !more {
			return n, ok, err
		}
		if field == 2 {
			bits, err := r.fixed64Field(wire)
			if err != nil {
				return 0, false, err
			}
			n, ok = math.Float64frombits(bits), true
			continue
		}
		if err := r.skip(wire); err != nil {
			return 0, false, err
		}
		ok = false
	}
}

func decodeLimitList(list []byte, resp *Response) error {
	r := reader{list}
	for {
		field, wire, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		if field != 1 {
			if err := r.skip(wire); err != nil {
				return err
			}
			continue
		}
		vb, err := r.bytesField(wire)
		if err != nil {
			return err
		}
		resp.Limits = append(resp.Limits, LimitInfo{})
		info := &resp.Limits[len(resp.Limits)-1]
		st, ok, err := valueField(vb, 5)
		if err != nil {
			return err
		}
		if ok {
			if err := decodeLimitInfo(st, info); err != nil {
				return err
			}
		}
	}
}

func decodeLimitInfo(st []byte, info *LimitInfo) error {
	r := reader{st}
	for {
		key, val, ok, err := r.structField()
		if err != nil || !ok {
			return err
		}
		var dst *float64
		switch key {
		case MetadataAlgorithm, MetadataFailureMode, MetadataName:
			s, ok, err := valueField(val, 3)
			if err != nil {
				return err
			}
			v := ""
			if ok {
				v = str(s)
			}
			switch key {
			case MetadataAlgorithm:
				info.Algorithm = v
			case MetadataFailureMode:
				info.FailureMode = v
			default:
				info.Name = v
			}
			continue
		case MetadataLimit:
			dst = &info.Limit
		case MetadataWindowMs:
			dst = &info.WindowMs
		case MetadataBurst:
			dst = &info.Burst
		case MetadataRetryAfterMs:
			dst = &info.RetryAfterMs
		case MetadataWaitMs:
			dst = &info.WaitMs
		default:
			continue
		}
		n, ok, err := numberValue(val)
		if err != nil {
			return err
		}
		*dst = 0
		if ok && !math.IsNaN(n) && !math.IsInf(n, 0) {
			*dst = n
		}
	}
}
