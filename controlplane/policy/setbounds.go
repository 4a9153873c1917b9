package policy

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Bounds on a policy set: the domains of every -policy file together, at
// start-up and on SIGHUP, and the domains of the policy store after an
// Apply. Each bounds what a set costs whatever its files say: the bytes read
// and parsed, and what the decisions keep per descriptor and per limit
// (about 3 KB a limit, more while its rule's metric series exist). The
// first file or Apply past a bound is refused with one error naming it and
// the bound, before anything else is read.
const (
	// MaxDomains is the most domains (so -policy files) in a set.
	MaxDomains = 256
	// MaxSetSize is the most bytes of policy documents in a set, all
	// domains together: four full-size documents.
	MaxSetSize = 4 * MaxDocumentSize
	// MaxDescriptors is the most descriptors in a set, all domains and
	// levels together, each alias counted as what it expands to.
	MaxDescriptors = 20_000
	// MaxLimits is the most limits in a set, all domains together, each
	// alias counted as what it expands to.
	MaxLimits = 10_000
)

// boundHint ends the error of a set bound.
const boundHint = "split the policies among several control planes, or use wildcard values instead of one descriptor per value"

// countLimit counts one more limit of the document, refusing one past
// MaxLimits.
func (p *parser) countLimit(raw *yaml.Node, path string) bool {
	if len(p.limits) < MaxLimits {
		return true
	}
	p.errorf(line(raw), path, "too many limits: more than %d (aliases expanded), at most %d in all the domains together: %s",
		MaxLimits, MaxLimits, boundHint)
	p.aborted = true
	return false
}

// SetTally adds up what a policy set holds, against the set bounds
// (MaxDomains, MaxSetSize, MaxDescriptors, MaxLimits). The zero value is an
// empty set.
type SetTally struct {
	Domains, Bytes, Descriptors, Limits int
}

// AddFile counts a document of size bytes named file, before it is read:
// an error if the set then has more than MaxDomains documents or
// MaxSetSize bytes.
func (t *SetTally) AddFile(file string, size int64) *Error {
	t.Domains++
	if t.Domains > MaxDomains {
		return &Error{File: file, Problem: fmt.Sprintf(
			"too many domains: this one takes the set past %d (one domain a file; files are counted in lexical order): %s", MaxDomains, boundHint)}
	}
	if size > int64(MaxSetSize-t.Bytes) {
		return &Error{File: file, Problem: fmt.Sprintf(
			"policy set too large: this file's %d bytes take the set past %d bytes (%d MiB, all the domains together): %s",
			size, MaxSetSize, MaxSetSize>>20, boundHint)}
	}
	t.Bytes += int(size)
	return nil
}

// AddDomain counts a parsed domain's descriptors and limits (read from
// file): an error if the set then has more than MaxDescriptors or
// MaxLimits.
func (t *SetTally) AddDomain(file string, d *Domain) *Error {
	return t.AddCounts(file, d.Name, d.descriptors, len(d.limits))
}

// AddCounts counts the descriptors and limits of domain (read from file)
// before it is parsed, when they are known without parsing it (an xDS
// resource's wire bytes): an error if the set then has more than
// MaxDescriptors or MaxLimits.
func (t *SetTally) AddCounts(file, domain string, descriptors, limits int) *Error {
	t.Descriptors += descriptors
	t.Limits += limits
	switch {
	case t.Descriptors > MaxDescriptors:
		return &Error{File: file, Domain: domain, Problem: fmt.Sprintf(
			"too many descriptors: this domain's %d take the set to %d, more than %d (all the domains together, aliases expanded): %s",
			descriptors, t.Descriptors, MaxDescriptors, boundHint)}
	case t.Limits > MaxLimits:
		return &Error{File: file, Domain: domain, Problem: fmt.Sprintf(
			"too many limits: this domain's %d take the set to %d, more than %d (all the domains together, aliases expanded): %s",
			limits, t.Limits, MaxLimits, boundHint)}
	}
	return nil
}

// Add counts one whole domain: its document's size, descriptors and limits.
func (t *SetTally) Add(file string, size int64, d *Domain) *Error {
	if err := t.AddFile(file, size); err != nil {
		return err
	}
	return t.AddDomain(file, d)
}
