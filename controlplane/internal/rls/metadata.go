package rls

import (
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// MetadataKey is the field of RateLimitResponse.dynamic_metadata in which
// sluice reports, for its filter's local precheck, the parameters of the
// limit that decided each descriptor: the contract is in the package
// documentation ("The metadata contract with the filter").
const MetadataKey = "sluice"

// Metadata struct field names (see MetadataKey).
const (
	MetaAlgorithm  = "algorithm"
	MetaLimit      = "limit"
	MetaWindowMs   = "window_ms"
	MetaBurst      = "burst"
	MetaRetryAfter = "retry_after_ms"
	MetaFailure    = "failure_mode"
	MetaWait       = "wait_ms"
	MetaName       = "name"
)

// limitMetadata returns the dynamic_metadata for one response. The common
// parts (a descriptor not over limit, a one-descriptor response) are built
// once per limit (limitInfo) and shared, read-only, by the responses.
func limitMetadata(outs []outcome) *structpb.Struct {
	if len(outs) == 1 && !outs[0].over() && outs[0].wait == 0 {
		if o := &outs[0]; o.info != nil && o.lim != nil && !o.failed {
			return o.info.single
		}
		if o := &outs[0]; o.lim == nil {
			return emptySingle
		}
	}
	list := make([]*structpb.Value, len(outs))
	for i := range outs {
		o := &outs[i]
		switch {
		case o.over():
			list[i] = metadataValue(o)
		case o.lim != nil && o.info != nil && !o.failed && o.wait == 0:
			list[i] = o.info.meta
		case o.lim == nil:
			list[i] = emptyValue
		default: // decided by failure_mode, or a limit override
			list[i] = metadataValue(o)
		}
	}
	return metadataStruct(list)
}

// emptyValue is the metadata of a descriptor that nothing limits and that
// is not over limit; emptySingle, the dynamic_metadata of a one-descriptor
// response of that kind. Shared, never modified.
var (
	emptyValue  = metadataValue(&outcome{})
	emptySingle = metadataStruct([]*structpb.Value{emptyValue})
)

// metadataStruct returns the dynamic_metadata holding list.
func metadataStruct(list []*structpb.Value) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataKey: structpb.NewListValue(&structpb.ListValue{Values: list}),
	}}
}

// metadataValue returns one descriptor's metadata struct (see MetadataKey).
func metadataValue(o *outcome) *structpb.Value {
	alg := ""
	var limit, windowMs, burst, retryMs float64
	if o.lim != nil && !o.lim.ShadowMode && !o.failed && o.lim.Requests > 0 {
		sl := o.info.store
		alg = o.lim.Algorithm.String()
		limit = float64(o.lim.Requests)
		windowMs = float64(o.lim.Window) / float64(time.Millisecond)
		if sl.Calendar != nil {
			// The shortest calendar window: a local limiter sized from it
			// never refuses what the calendar admits.
			windowMs = float64(sl.Calendar.Shortest()) / float64(time.Millisecond)
		}
		burst = float64(capacity(sl))
	}
	if o.over() {
		retryMs = float64(o.res.RetryAfter) / float64(time.Millisecond)
	}
	fields := map[string]*structpb.Value{
		MetaAlgorithm:  structpb.NewStringValue(alg),
		MetaLimit:      structpb.NewNumberValue(limit),
		MetaWindowMs:   structpb.NewNumberValue(windowMs),
		MetaBurst:      structpb.NewNumberValue(burst),
		MetaRetryAfter: structpb.NewNumberValue(retryMs),
	}
	if o.wait > 0 && !o.over() {
		fields[MetaWait] = structpb.NewNumberValue(float64(o.wait) / float64(time.Millisecond))
	}
	if o.lim != nil {
		// Every limit of one descriptor shares its failure mode (a
		// descriptor's, inherited by nested ones), so the reported limit's
		// is the descriptor's.
		fields[MetaFailure] = structpb.NewStringValue(string(o.lim.FailureMode))
		fields[MetaName] = structpb.NewStringValue(LimitName(o.lim))
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: fields})
}
