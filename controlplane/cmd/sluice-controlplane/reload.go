package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
	"github.com/sluicehq/sluice/controlplane/policystore"
)

// reloadTimeout bounds one SIGHUP's writes to the policy store.
const reloadTimeout = 30 * time.Second

// applier is the policy store's Apply: ratectl apply's path.
type applier interface {
	Apply(ctx context.Context, source string, data []byte, g policystore.Guard) (policystore.ApplyResult, error)
}

// reloadOnHangup re-reads the -policy files on every signal from hup, and
// every time changed reports that they changed (-policy-watch), until ctx
// ends.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, changed <-chan struct{}, log *slog.Logger, paths []string, st applier) {
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
		reload(actx, log, cause, paths, st)
		cancel()
	}
}

// reload re-reads the -policy files and applies each domain they hold to the
// policy store, as ratectl apply would: every file is read and validated
// first (the same bounds as at start-up), so an invalid set changes nothing;
// then each domain replaces the stored one atomically, and every replica on
// the same store follows. Domains held by the store but absent from the
// files are left alone (ratectl delete removes them). It logs one line.
// cause ("SIGHUP", "policy files changed") starts the line.
func reload(ctx context.Context, log *slog.Logger, cause string, paths []string, st applier) {
	if len(paths) == 0 {
		log.Warn(cause + ": no -policy files to re-read; the policies are unchanged")
		return
	}
	files, err := policy.ReadFiles(paths...)
	if err != nil {
		log.Error(cause+": refused the -policy files; the current policies stay",
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
