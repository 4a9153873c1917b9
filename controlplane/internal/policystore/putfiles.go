package policystore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// PutFiles puts the policy files of sources in force: each file owns the
// domain it holds, and the newest files win (see SourceState). The files'
// domains with the store's other domains must pass the set bounds (a
// policy.ErrorList otherwise), and none may be a domain Options.Owner names
// (an *OwnedError): either refuses the whole call, and nothing changes.
// PutFiles returns what it did per source once this replica's snapshot
// holds the result.
func (s *Store) PutFiles(ctx context.Context, sources []Source) ([]SourceResult, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	srcs, err := s.checkFiles(s.Current(), sources)
	if err != nil {
		return nil, err
	}
	res, v, err := s.b.PutSources(ctx, srcs)
	if errors.Is(err, ErrUninitialized) {
		// The store is new or was lost: write back what this replica
		// holds first, as Apply does.
		if err = s.refresh(ctx); err == nil {
			res, v, err = s.b.PutSources(ctx, srcs)
		}
	}
	if err != nil {
		return nil, err
	}
	if v > 0 {
		written := map[string]*Policy{}
		for _, src := range sources {
			for _, f := range src.Files {
				written[f.Domain.Name] = &Policy{Domain: f.Domain.Name, Version: v, YAML: f.Data, Parsed: f.Domain}
			}
		}
		s.written.Store(&written)
		s.catchUp(ctx, v)
	}
	return res, nil
}

// checkFiles refuses sources when one of their domains has an owner other
// than the files (Options.Owner), or when snap's policies, those of the
// sources' paths replaced by the files', would pass a set bound; else it
// returns them as PutSources takes them.
func (s *Store) checkFiles(snap *Snapshot, sources []Source) ([]SourceState, error) {
	paths := map[string]bool{}
	named := map[string]bool{}
	for _, src := range sources {
		paths[src.Path] = true
		for _, f := range src.Files {
			named[f.Domain.Name] = true
			if s.owner != nil {
				if o := s.owner(f.Domain.Name); o != "" {
					return nil, &OwnedError{Domain: f.Domain.Name, Owner: o}
				}
			}
		}
	}
	t := tally(snap, func(p *Policy) bool { return !named[p.Domain] && !paths[p.Source] })
	srcs := make([]SourceState, len(sources))
	for i, src := range sources {
		for _, f := range src.Files {
			if err := t.Add(f.Path, int64(len(f.Data)), f.Domain); err != nil {
				return nil, policy.ErrorList{err}
			}
		}
		srcs[i] = src.state()
	}
	return srcs, nil
}

// putPending puts Options.Files in force, under refreshMu, with snap the
// store as just loaded; it returns the store's state after. A refusal
// (bounds, owner) is logged and drops them: the store's version stays.
func (s *Store) putPending(ctx context.Context, snap *Snapshot) (State, error) {
	srcs, err := s.checkFiles(snap, s.pending)
	if err == nil {
		var res []SourceResult
		if res, _, err = s.b.PutSources(ctx, srcs); err != nil {
			return State{}, err // retried at the next refresh
		}
		LogResults(s.log, "start-up", res)
	} else {
		s.log.Error("start-up: the policy store refused the policy files; serving what the store holds",
			"policy", sourcePaths(s.pending), "error", err.Error())
	}
	s.pending = nil
	return s.b.Load(ctx)
}

// sourcePaths joins the sources' paths, for logs.
func sourcePaths(sources []Source) string {
	paths := make([]string, len(sources))
	for i, s := range sources {
		paths[i] = s.Path
	}
	return strings.Join(paths, ",")
}

// LogResults logs what PutFiles did, cause ("start-up", "SIGHUP", "policy
// files changed") starting each line: one INFO line for the sources put in
// force (the domains changed, unchanged and deleted), and a WARN line for
// each source whose files were older than the version in force, and for
// domains that newer files of another path own.
func LogResults(log *slog.Logger, cause string, res []SourceResult) {
	var inForce, changed, unchanged, deleted []string
	for _, r := range res {
		switch r.Outcome {
		case InForce:
			inForce = append(inForce, r.Path)
			changed = append(changed, r.Changed...)
			unchanged = append(unchanged, r.Unchanged...)
			deleted = append(deleted, r.Deleted...)
			if len(r.Kept) > 0 {
				log.Warn(cause+": domains of these policy files are owned by newer files of another -policy path, and stay theirs",
					"policy", r.Path, "domains", strings.Join(r.Kept, ","))
			}
		case Older:
			log.Warn(cause+": the policy files are older than the version of them in force, which stays: the newest files win (a replica whose files changed later put them in force)",
				"policy", r.Path, "in_force_changed", time.Unix(0, r.Record.Stamp).UTC().Format(time.RFC3339Nano))
		}
	}
	if len(inForce) > 0 {
		log.Info(cause+": the policy files are in force", "policy", strings.Join(inForce, ","),
			"changed", strings.Join(changed, ","), "unchanged", strings.Join(unchanged, ","), "deleted", strings.Join(deleted, ","))
	}
}
