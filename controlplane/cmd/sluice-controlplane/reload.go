package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/internal/policystore"
	"github.com/sluicehq/sluice/controlplane/policy"
)

// reloadTimeout bounds one SIGHUP's writes to the policy store.
const reloadTimeout = 30 * time.Second

// policyStore is what a reload needs of the policy store: PutFiles, and
// Apply (ratectl apply's path) for -policy-seed-only.
type policyStore interface {
	PutFiles(ctx context.Context, sources []policystore.Source) ([]policystore.SourceResult, error)
	Apply(ctx context.Context, source string, data []byte, g policystore.Guard) (policystore.ApplyResult, error)
}

// policyFiles are the -policy paths and how they reach the policy store.
type policyFiles struct {
	paths []string
	// seedOnly: the files only seed an empty store and own nothing; a
	// reload applies their domains as ratectl apply would.
	seedOnly bool
}

// readPolicies reads the -policy files at start: as sources whose files
// own their domains, or, seedOnly, as the set that seeds an empty store.
func readPolicies(paths []string, seedOnly bool) (*policy.Set, []policystore.Source, error) {
	if seedOnly {
		set, err := policy.Load(paths...)
		return set, nil, err
	}
	srcs, err := policystore.ReadSources(paths...)
	if err != nil {
		return nil, nil, err
	}
	empty, _ := policy.NewSet()
	return empty, srcs, nil
}

// reloadOnHangup re-reads the -policy files on every signal from hup, and
// every time changed reports that they changed (-policy-watch), until ctx
// ends.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, changed <-chan struct{}, log *slog.Logger, files policyFiles, st policyStore) {
	for {
		cause := "SIGHUP"
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-changed:
			cause = "policy files changed"
		}
		actx, cancel := context.WithTimeout(ctx, reloadTimeout)
		reload(actx, log, cause, files, st, time.Now())
		cancel()
	}
}

// reload re-reads the -policy files and puts them in force: every file is
// read and validated first (the same bounds as at start-up), so an invalid
// set changes nothing and the policies in force stay. Then, in one step,
// the files' domains replace the stored ones and the domains the files no
// longer name are deleted, unless the store holds newer files of the same
// paths (policystore.SourceState); every replica on the same store
// follows. On SIGHUP the files count as changed at now: the signal puts
// them in force whatever their age. cause ("SIGHUP", "policy files
// changed") starts each log line.
func reload(ctx context.Context, log *slog.Logger, cause string, files policyFiles, st policyStore, now time.Time) {
	if len(files.paths) == 0 {
		log.Warn(cause + ": no -policy files to re-read; the policies are unchanged")
		return
	}
	if files.seedOnly {
		applyFiles(ctx, log, cause, files.paths, st)
		return
	}
	srcs, err := policystore.ReadSources(files.paths...)
	if err != nil {
		log.Error(cause+": refused the -policy files; the policies in force stay",
			"policy", strings.Join(files.paths, ","), "error", err.Error())
		return
	}
	if cause == "SIGHUP" {
		for i := range srcs {
			if now.After(srcs[i].Stamp) {
				srcs[i].Stamp = now
			}
		}
	}
	res, err := st.PutFiles(ctx, srcs)
	if err != nil {
		log.Error(cause+": the policy store refused the -policy files; the policies in force stay",
			"policy", strings.Join(files.paths, ","), "error", err.Error())
		return
	}
	policystore.LogResults(log, cause, res)
}

// applyFiles applies each domain of the -policy files to the policy store,
// as ratectl apply would (-policy-seed-only): every file is read and
// validated first, then each domain replaces the stored one. Domains the
// store holds but the files do not are left alone. It logs one line.
func applyFiles(ctx context.Context, log *slog.Logger, cause string, paths []string, st policyStore) {
	files, err := policy.ReadFiles(paths...)
	if err != nil {
		log.Error(cause+": refused the -policy files; the policies in force stay",
			"policy", strings.Join(paths, ","), "error", err.Error())
		return
	}
	var changed, unchanged []string
	for i, f := range files {
		res, err := st.Apply(ctx, f.Path, f.Data, policystore.Guard{})
		if err != nil {
			var left []string
			for _, g := range files[i:] {
				left = append(left, g.Domain.Name)
			}
			log.Error(cause+": the policy store refused a domain; the domains before it were applied",
				"policy", strings.Join(paths, ","), "changed", strings.Join(changed, ","),
				"unchanged", strings.Join(unchanged, ","), "not_applied", strings.Join(left, ","), "error", err.Error())
			return
		}
		if res.Unchanged {
			unchanged = append(unchanged, res.Domain)
		} else {
			changed = append(changed, res.Domain)
		}
	}
	log.Info(cause+": applied the -policy files", "policy", strings.Join(paths, ","),
		"changed", strings.Join(changed, ","), "unchanged", strings.Join(unchanged, ","))
}
