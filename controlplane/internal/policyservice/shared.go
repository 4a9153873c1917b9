package policyservice

import (
	"runtime"
	"sync"
	"weak"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// maxDeltas bounds the Watch changes kept for the current version: one per
// version the watchers come from (almost always the one before).
const maxDeltas = 8

// shared keeps the answers of the version in force that many clients are
// sent (List, Get, Watch's messages), each built and encoded once: the
// codec (Service.Codec) sends every client the same bytes where it would
// marshal a copy per client, so a thousand watchers of a 4 MiB set hold
// one copy of it, not a thousand. A new version (of the store or the
// overlay) replaces them; a message still on its way to a slow client
// keeps its bytes until it is sent or its connection ends.
type shared struct {
	mu      sync.Mutex
	snap    *policystore.Snapshot
	overlay *policy.Set
	list    *sluicev1.ListResponse
	get     map[string]*sluicev1.GetResponse
	full    *sluicev1.WatchResponse                           // Watch's first message
	deltas  map[*policystore.Snapshot]*sluicev1.WatchResponse // Watch's changes from a version to snap

	encMu   sync.Mutex
	encoded map[any][]byte // weak.Pointer of a message above -> its encoding, while it lives
}

// at makes snap and overlay the version the answers are for, dropping
// those of another; under mu.
func (c *shared) at(snap *policystore.Snapshot, overlay *policy.Set) {
	if c.snap != snap || c.deltas == nil {
		c.full, c.deltas = nil, map[*policystore.Snapshot]*sluicev1.WatchResponse{}
	}
	if c.snap != snap || c.overlay != overlay || c.get == nil {
		c.list, c.get = nil, map[string]*sluicev1.GetResponse{}
	}
	c.snap, c.overlay = snap, overlay
}

// keep encodes msg for the codec, for as long as msg lives. A message that
// does not encode is left to the codec, which reports the error.
func keep[T any, P interface {
	*T
	proto.Message
}](c *shared, msg P) P {
	if msg == nil {
		return nil
	}
	b, err := proto.Marshal(msg)
	if err != nil {
		return msg
	}
	key := weak.Make((*T)(msg))
	c.encMu.Lock()
	if c.encoded == nil {
		c.encoded = map[any][]byte{}
	}
	c.encoded[key] = b
	c.encMu.Unlock()
	runtime.AddCleanup((*T)(msg), func(k weak.Pointer[T]) {
		c.encMu.Lock()
		delete(c.encoded, k)
		c.encMu.Unlock()
	}, key)
	return msg
}

// encoding returns the encoding of m when it is a shared message.
func (c *shared) encoding(m any) ([]byte, bool) {
	var key any
	switch m := m.(type) {
	case *sluicev1.ListResponse:
		key = weak.Make(m)
	case *sluicev1.GetResponse:
		key = weak.Make(m)
	case *sluicev1.WatchResponse:
		key = weak.Make(m)
	default:
		return nil, false
	}
	c.encMu.Lock()
	defer c.encMu.Unlock()
	b, ok := c.encoded[key]
	return b, ok
}

// listResponse returns the shared List answer for snap and overlay.
func (c *shared) listResponse(snap *policystore.Snapshot, overlay *policy.Set, build func() *sluicev1.ListResponse) *sluicev1.ListResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(snap, overlay)
	if c.list == nil {
		c.list = keep(c, build())
	}
	return c.list
}

// getResponse returns the shared Get answer for domain (nil: no such
// domain). The answers kept are at most the set's domains.
func (c *shared) getResponse(snap *policystore.Snapshot, overlay *policy.Set, domain string, build func() *sluicev1.GetResponse) *sluicev1.GetResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(snap, overlay)
	if r, ok := c.get[domain]; ok {
		return r
	}
	r := build()
	if r != nil {
		c.get[domain] = keep(c, r)
	}
	return r
}

// watchMessage returns the shared Watch message that takes a watcher from
// prev (nil: nothing yet) to snap, or nil when there is nothing to tell.
// The changes from a version past the maxDeltas kept are the caller's
// alone.
func (c *shared) watchMessage(prev, snap *policystore.Snapshot) *sluicev1.WatchResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at(snap, c.overlay)
	if prev == nil {
		if c.full == nil {
			c.full = keep(c, changes(nil, snap))
		}
		return c.full
	}
	if m, ok := c.deltas[prev]; ok {
		return m
	}
	m := changes(prev, snap)
	if m != nil && len(c.deltas) < maxDeltas {
		c.deltas[prev] = keep(c, m)
	}
	return m
}

// Codec returns base with the shared answers of s sent as they were
// encoded once; everything else goes through base. Serve the Service with
// it (grpc.ForceServerCodecV2).
func (s *Service) Codec(base encoding.CodecV2) encoding.CodecV2 {
	return sharedCodec{base, &s.shared}
}

// sharedCodec is Service.Codec.
type sharedCodec struct {
	encoding.CodecV2
	shared *shared
}

// Marshal returns a shared answer's bytes (read only: a SliceBuffer is
// never freed into a pool), else base's encoding.
func (c sharedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := c.shared.encoding(v); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}
