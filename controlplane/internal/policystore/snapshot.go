package policystore

import (
	"bytes"
	"fmt"
	"log/slog"
	"sort"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// Policy is one domain's policy in a snapshot.
type Policy struct {
	// Domain is the domain.
	Domain string
	// Version is the store version at which the domain was last written;
	// 0 for a seed policy not yet written to the store.
	Version uint64
	// YAML is the policy as applied. It must not be modified.
	YAML []byte
	// Parsed is the parsed, validated policy.
	Parsed *policy.Domain
	// Owner is the policy file that owns the domain, "" when the store
	// owns it (ratectl).
	Owner string
	// Source is the -policy path Owner was read through ("" when the
	// store owns the domain).
	Source string
}

// Snapshot is one whole version of the policy set. It is immutable: the
// Store replaces its snapshot, never changes one, so everything read from
// one snapshot belongs to one version.
type Snapshot struct {
	// Version is the store version the snapshot reflects; 0 before the
	// store was first read (the snapshot then holds the seed, if any).
	Version uint64
	// Set holds the parsed domains, for matching requests.
	Set *policy.Set

	policies []*Policy          // sorted by domain
	byDomain map[string]*Policy // the same, by domain
	sources  []SourceRecord     // the versions of the sources in force, by path
}

// Policy returns the named domain's policy, or nil.
func (s *Snapshot) Policy(domain string) *Policy {
	if s == nil {
		return nil
	}
	return s.byDomain[domain]
}

// Policies returns every policy, sorted by domain. The slice is shared: do
// not modify it.
func (s *Snapshot) Policies() []*Policy {
	if s == nil {
		return nil
	}
	return s.policies
}

// state returns the snapshot as a state to write back with Backend.Init:
// the version and each domain's version raised to at least 1.
func (s *Snapshot) state() State {
	st := State{Version: max(s.Version, 1), Records: make([]Record, len(s.policies)), Sources: s.sources}
	for i, p := range s.policies {
		v := max(p.Version, 1)
		st.Version = max(st.Version, v)
		st.Records[i] = Record{Domain: p.Domain, Version: v, YAML: p.YAML, Owner: p.Owner, Source: p.Source}
	}
	return st
}

// newSnapshot assembles a snapshot from policies sorted by domain.
func newSnapshot(version uint64, policies []*Policy, sources []SourceRecord) *Snapshot {
	s := &Snapshot{Version: version, policies: policies, byDomain: make(map[string]*Policy, len(policies)), sources: sources}
	domains := make([]*policy.Domain, len(policies))
	for i, p := range policies {
		s.byDomain[p.Domain] = p
		domains[i] = p.Parsed
	}
	set, err := policy.NewSet(domains...)
	if err != nil { // cannot happen: policies are unique by domain
		panic(fmt.Sprintf("policystore: %v", err))
	}
	s.Set = set
	return s
}

// sourceName is the name a stored policy is parsed under, which its errors
// and Domain.Source show.
func sourceName(backend, domain string, version uint64) string {
	return fmt.Sprintf("%s:%s@v%d", backend, domain, version)
}

// buildSnapshot parses a state read from the backend. A domain whose
// version and text are those of prev's is not parsed again, nor one this
// replica just wrote and parsed (written: by domain, at the version written).
// A stored policy that fails to parse (written by a sluice with other
// rules, or damaged) is logged; prev's version of that domain is kept if
// there is one, else the domain is left out.
func buildSnapshot(backend string, st State, prev *Snapshot, written map[string]*Policy, log *slog.Logger) *Snapshot {
	policies := make([]*Policy, 0, len(st.Records))
	for _, rec := range st.Records {
		old := prev.Policy(rec.Domain)
		if old != nil && old.Version == rec.Version && bytes.Equal(old.YAML, rec.YAML) && old.Owner == rec.Owner && old.Source == rec.Source {
			policies = append(policies, old)
			continue
		}
		if w := written[rec.Domain]; w != nil && w.Version == rec.Version && bytes.Equal(w.YAML, rec.YAML) {
			policies = append(policies, &Policy{Domain: rec.Domain, Version: rec.Version, YAML: rec.YAML, Parsed: w.Parsed, Owner: rec.Owner, Source: rec.Source})
			continue
		}
		d, err := policy.Parse(sourceName(backend, rec.Domain, rec.Version), rec.YAML)
		if err == nil && d.Name != rec.Domain {
			err = fmt.Errorf("the policy names domain %q", d.Name)
		}
		if err != nil {
			if old != nil {
				log.Error("policy store: a stored policy is invalid; keeping the previous version of the domain",
					"domain", rec.Domain, "version", rec.Version, "kept_version", old.Version, "error", err)
				policies = append(policies, old)
			} else {
				log.Error("policy store: a stored policy is invalid; the domain is left out",
					"domain", rec.Domain, "version", rec.Version, "error", err)
			}
			continue
		}
		policies = append(policies, &Policy{Domain: rec.Domain, Version: rec.Version, YAML: rec.YAML, Parsed: d, Owner: rec.Owner, Source: rec.Source})
	}
	return newSnapshot(st.Version, policies, st.Sources)
}

// seedSnapshot returns the version-0 snapshot of the seed set and the
// policy files (which own their domains, and win over the seed's domain of
// the same name): each domain as the document it was parsed from, byte for
// byte, so that applying the same file again (SIGHUP, ratectl apply) finds
// it unchanged; a domain not parsed from a document is written as
// canonical YAML.
func seedSnapshot(seed *policy.Set, files []Source) (*Snapshot, error) {
	byDomain := map[string]*Policy{}
	for _, d := range seed.Domains() {
		y := d.Text()
		if y == nil {
			var err error
			if y, err = policy.Marshal(d); err != nil {
				return nil, fmt.Errorf("policystore: seed domain %q: %v", d.Name, err)
			}
		}
		byDomain[d.Name] = &Policy{Domain: d.Name, YAML: y, Parsed: d}
	}
	for _, src := range files {
		for _, f := range src.Files {
			byDomain[f.Domain.Name] = &Policy{Domain: f.Domain.Name, YAML: f.Data, Parsed: f.Domain, Owner: f.Path, Source: src.Path}
		}
	}
	policies := make([]*Policy, 0, len(byDomain))
	for _, p := range byDomain {
		policies = append(policies, p)
	}
	sort.Slice(policies, func(i, j int) bool { return policies[i].Domain < policies[j].Domain })
	return newSnapshot(0, policies, nil), nil
}
