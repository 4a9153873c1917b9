package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	sluicev1 "github.com/sluicehq/sluice/controlplane/api/sluice/v1"
	"github.com/sluicehq/sluice/controlplane/policy"
)

var applyCmd = &command{
	name:    "apply",
	args:    "-f FILE [-f FILE ...] [--expected-version N] [--take-over]",
	summary: "validate and store policies, one domain per file (a directory: its *.yaml and *.yml files, searched as -policy searches it; -: standard input)",
	setup: func(fs *flag.FlagSet) runner {
		var files stringsFlag
		var expected versionFlag
		fs.Var(&files, "f", "policy `file` (repeatable); a directory applies its *.yaml/*.yml files; - reads standard input")
		fs.Var(&files, "filename", "same as -f `file`")
		fs.Var(&expected, "expected-version", "apply only if the domain is at this `version` (0: only if it does not exist yet); see get")
		takeOver := fs.Bool("take-over", false, "apply to a domain a policy file owns, taking it over (for a file no control plane reads any more; one that reads it takes the domain back)")
		return func(ctx context.Context, e *env, args []string) error {
			return runApply(ctx, e, args, files, expected, *takeOver)
		}
	},
}

// applyResult is apply's output for one file.
type applyResult struct {
	Source    string `json:"source" yaml:"source"`
	Domain    string `json:"domain" yaml:"domain"`
	Version   uint64 `json:"version" yaml:"version"`
	Unchanged bool   `json:"unchanged" yaml:"unchanged"`
}

// policyDoc is one document to apply.
type policyDoc struct {
	source string
	data   []byte
}

func runApply(ctx context.Context, e *env, args []string, files []string, expected versionFlag, takeOver bool) error {
	if len(args) > 0 {
		return usagef("apply: unexpected argument %q: policy files go after -f", args[0])
	}
	if len(files) == 0 {
		return usagef("apply: no policy file: give -f FILE")
	}
	docs, err := readPolicyFiles(e.stdin, files)
	if err != nil {
		return err
	}
	if expected.set && len(docs) > 1 {
		return usagef("apply: --expected-version applies to one domain: give one file (got %d)", len(docs))
	}
	client, ctx, done, err := e.policyClient(ctx, false)
	if err != nil {
		return err
	}
	defer done()
	var results []applyResult
	var failed error
	for _, d := range docs {
		res, err := client.Apply(ctx, &sluicev1.ApplyRequest{Yaml: string(d.data), Source: d.source, ExpectedVersion: expected.ptr(), TakeOver: takeOver})
		if err != nil {
			failed = e.explain(err, e.policyTarget())
			if len(docs) > 1 {
				failed = fmt.Errorf("%s: %w", d.source, failed)
			}
			break
		}
		results = append(results, applyResult{Source: d.source, Domain: res.GetDomain(), Version: res.GetVersion(), Unchanged: res.GetUnchanged()})
	}
	if err := e.print(results, func(w io.Writer) {
		for _, r := range results {
			if r.Unchanged {
				fmt.Fprintf(w, "domain %q unchanged at version %d (%s)\n", r.Domain, r.Version, r.Source)
			} else {
				fmt.Fprintf(w, "domain %q applied: version %d (%s)\n", r.Domain, r.Version, r.Source)
			}
		}
	}); err != nil {
		return err
	}
	if failed != nil && len(docs) > 1 {
		var names []string
		for _, d := range docs[len(results)+1:] {
			names = append(names, d.source)
		}
		if len(names) > 0 {
			failed = fmt.Errorf("%w\nnot applied: %s", failed, strings.Join(names, ", "))
		}
	}
	return failed
}

// readPolicyFiles reads the -f arguments: a directory's policy files are
// found as sluice-controlplane's -policy finds them, each file is read up to
// the policy size bound, and two files that name one domain are refused
// before anything is sent (applying both would leave whichever came last).
func readPolicyFiles(stdin io.Reader, paths []string) ([]policyDoc, error) {
	var docs []policyDoc
	read := func(name string, r io.Reader) error {
		data, err := policy.ReadBounded(name, r)
		if err != nil {
			return err
		}
		docs = append(docs, policyDoc{source: name, data: data})
		return nil
	}
	for _, p := range paths {
		if p == "-" {
			if err := read("stdin", stdin); err != nil {
				return nil, fmt.Errorf("-f -: %w", err)
			}
			continue
		}
		files, err := policy.Files(p)
		if err != nil {
			return nil, fmt.Errorf("-f %s: %v", p, err)
		}
		for _, f := range files {
			r, err := os.Open(f)
			if err != nil {
				return nil, fmt.Errorf("-f %s: %v", f, unwrapPathErr(err))
			}
			err = read(f, r)
			r.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	first := map[string]string{}
	for _, d := range docs {
		domain := policy.PeekDomain(d.data)
		if domain == "" {
			continue // the policy service says what is wrong with it
		}
		if prev, dup := first[domain]; dup {
			return nil, fmt.Errorf("%s and %s both define domain %q: one file per domain (applying both would leave the last); nothing was applied",
				prev, d.source, domain)
		}
		first[domain] = d.source
	}
	return docs, nil
}
