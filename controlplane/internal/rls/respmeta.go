// envoyproxy/ratelimit's response dynamic metadata.

package rls

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The fields of envoyproxy/ratelimit's response dynamic metadata.
const (
	ERMetaDomain      = "domain"      // the request's domain
	ERMetaDescriptors = "descriptors" // one struct per request descriptor
	ERMetaHitsAddend  = "hitsAddend"  // the request's (or a descriptor's) hits_addend, when set
	ERMetaMetadata    = "metadata"    // the descriptors' configured metadata, merged
	ERMetaEntries     = "entries"     // a descriptor's entries, "key=value"
	ERMetaLimit       = "limit"       // a descriptor's limit override, in protobuf text
)

// responseMetadata returns sluice's dynamic metadata (base, whose fields are
// kept) with envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA fields added,
// as its ratelimitToMetadata builds them:
//
//	domain:      the request's domain
//	descriptors: per request descriptor {entries: ["key=value", ...],
//	             limit: its override in protobuf text (when set),
//	             hitsAddend: its hits_addend (when set)}
//	hitsAddend:  the request's hits_addend (when not 0)
//	metadata:    the metadata of the descriptors that passed (status OK, a
//	             shadow-mode one included; not unlimited ones), merged in
//	             request order: the first value of a key wins, and two
//	             mappings under one key are merged the same way
//
// base may be shared (see limitMetadata): it is copied, never modified, and
// so is every configured metadata merged in.
func responseMetadata(req *rlsv3.RateLimitRequest, outs []outcome, unlimited []bool, base *structpb.Struct) *structpb.Struct {
	fields := make(map[string]*structpb.Value, len(base.GetFields())+4)
	for k, v := range base.GetFields() {
		fields[k] = v
	}
	fields[ERMetaDomain] = structpb.NewStringValue(req.GetDomain())
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		descs = append(descs, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields[ERMetaDescriptors] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields[ERMetaHitsAddend] = structpb.NewNumberValue(float64(h))
	}
	var merged *structpb.Struct
	for i := range outs {
		o := &outs[i]
		if unlimited[i] || o.over() || o.lim == nil || o.lim.Metadata == nil {
			continue
		}
		if merged == nil {
			merged = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		mergeMetadata(merged, o.lim.Metadata)
	}
	if len(merged.GetFields()) > 0 {
		fields[ERMetaMetadata] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// descriptorStruct describes one request descriptor (see responseMetadata).
func descriptorStruct(d *ratelimitv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
	}
	fields := map[string]*structpb.Value{ERMetaEntries: structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		fields[ERMetaLimit] = structpb.NewStringValue(prototext.MarshalOptions{}.Format(l))
	}
	if h := d.GetHitsAddend(); h != nil {
		fields[ERMetaHitsAddend] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst: a key dst lacks is added (a copy of
// src's value, so that dst can be merged into later without touching src);
// a key both hold as mappings is merged recursively; otherwise dst's value
// stays.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		cur, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if cs, vs := cur.GetStructValue(), v.GetStructValue(); cs != nil && vs != nil {
			mergeMetadata(cs, vs)
		}
	}
}
