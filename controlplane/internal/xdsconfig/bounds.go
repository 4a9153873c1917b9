package xdsconfig

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// A response is held to the bounds of a policy set (policy.MaxDomains,
// MaxSetSize, MaxDescriptors, MaxLimits) and each resource to those of a
// policy document (policy.MaxDocumentSize), before any resource is
// decoded: converting a resource builds a YAML tree of it, which costs
// hundreds of times its wire bytes, so a response within the message
// size limit (16 MiB) but past the bounds must be refused from its wire
// bytes alone. checkBounds reads them with protowire, allocating nothing
// per descriptor.

// maxDescriptorDepth bounds how deeply a resource's descriptors nest
// before it is decoded: a policy document allows about 60 levels
// (policy.MaxDepth counts two YAML levels a descriptor), so a resource
// nested deeper would be refused by the parser anyway.
const maxDescriptorDepth = policy.MaxDepth / 2

// Field numbers of ratelimit.config.ratelimit.v3 (rls_conf.proto).
const (
	configName        = 1 // RateLimitConfig.name
	configDomain      = 2 // RateLimitConfig.domain
	configDescriptors = 3 // RateLimitConfig.descriptors
	descRateLimit     = 3 // RateLimitDescriptor.rate_limit
	descDescriptors   = 4 // RateLimitDescriptor.descriptors
)

// wireCounts is what a RateLimitConfig's wire bytes hold, as far as the
// bounds are concerned.
type wireCounts struct {
	name, domain        string
	descriptors, limits int
}

// errTooDeep is a resource whose descriptors nest past maxDescriptorDepth.
var errTooDeep = fmt.Errorf("descriptors nested too deeply: more than %d levels (a policy allows about 60)", maxDescriptorDepth)

// scanConfig counts the descriptors (every level) and limits (descriptors
// with a rate_limit, unlimited ones too, as the parser counts them) of a
// RateLimitConfig's wire bytes b.
func scanConfig(b []byte) (wireCounts, error) {
	var c wireCounts
	err := scanFields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case typ != protowire.BytesType:
		case num == configName:
			c.name = string(v)
		case num == configDomain:
			c.domain = string(v)
		case num == configDescriptors:
			return scanDescriptor(v, 1, &c)
		}
		return nil
	})
	return c, err
}

// scanDescriptor counts a RateLimitDescriptor at depth and, recursively,
// its children.
func scanDescriptor(b []byte, depth int, c *wireCounts) error {
	if depth > maxDescriptorDepth {
		return errTooDeep
	}
	c.descriptors++
	limit := false
	err := scanFields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case typ != protowire.BytesType:
		case num == descRateLimit:
			limit = true // several occurrences merge into one message
		case num == descDescriptors:
			return scanDescriptor(v, depth+1, c)
		}
		return nil
	})
	if limit {
		c.limits++
	}
	return err
}

// scanFields calls fn with each field of the message b: its number, wire
// type, and for a length-delimited field its bytes.
func scanFields(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// checkBounds checks the scanned resources of one response against the
// set's bounds: nil, or an error naming the first bound passed and the
// resource that passes it. Resources that did not scan are left to Decode,
// which names them.
func checkBounds(resources []wireResource) error {
	var t policy.SetTally
	for _, r := range resources {
		if r.err != nil {
			continue
		}
		size := len(r.value)
		if size > policy.MaxDocumentSize {
			return fmt.Errorf("resource %q: %d bytes, more than the %d (1 MiB) one domain's policy may hold",
				r.name, size, policy.MaxDocumentSize)
		}
		if t.Bytes += size; t.Bytes > policy.MaxSetSize {
			return fmt.Errorf("resource %q: its %d bytes take the response to %d bytes, more than the %d (%d MiB) a policy set may hold: %s",
				r.name, size, t.Bytes, policy.MaxSetSize, policy.MaxSetSize>>20, boundHint)
		}
		if err := t.AddCounts(sourcePrefix+r.name, r.counts.domain, r.counts.descriptors, r.counts.limits); err != nil {
			return fmt.Errorf("resource %q: %s", r.name, err.Problem)
		}
	}
	return nil
}

// boundHint ends the error of a set bound.
const boundHint = "the xDS server must split its rate limits among several control planes"

// wireResource is one resource of a response, scanned.
type wireResource struct {
	name   string // the resource's name, or "#index"
	value  []byte // its RateLimitConfig's wire bytes
	counts wireCounts
	err    error // the type or the bytes are wrong: Decode says so
}
