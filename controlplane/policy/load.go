package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Load reads policy files and returns the set of their domains. Each path is
// a file (read whatever its name) or a directory, searched recursively for
// *.yaml and *.yml files; names starting with "." are skipped (so the
// "..data" links of a Kubernetes ConfigMap volume are not read twice), and
// symbolic links to files are followed. Files load in lexical order; each
// holds one domain, and a domain defined twice is an error naming both files.
//
// Load reads everything before failing, so the ErrorList it returns names
// every problem in every file.
func Load(paths ...string) (*Set, error) {
	var files []string
	var errs ErrorList
	for _, p := range paths {
		found, err := policyFiles(p)
		if err != nil {
			errs = append(errs, &Error{File: p, Problem: err.Error()})
			continue
		}
		files = append(files, found...)
	}
	s := &Set{domains: map[string]*Domain{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, &Error{File: f, Problem: "cannot read: " + unwrapPathError(err)})
			continue
		}
		d, err := Parse(f, data)
		if err != nil {
			var list ErrorList
			if errors.As(err, &list) {
				errs = append(errs, list...)
			} else {
				errs = append(errs, &Error{File: f, Problem: err.Error()})
			}
			continue
		}
		if prev, dup := s.domains[d.Name]; dup {
			errs = append(errs, &Error{File: f, Line: d.nameLine, Domain: d.Name, Field: "domain",
				Problem: "duplicate domain (already defined in " + prev.Source + "): one file per domain"})
			continue
		}
		s.domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

// policyFiles returns the policy files under path, sorted.
func policyFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, errors.New(unwrapPathError(err))
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	var out []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != path && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isPolicyName(d.Name()) {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			st, err := os.Stat(p)
			if err != nil || !st.Mode().IsRegular() {
				return nil // a dangling link or a link to a directory
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("directory holds no .yaml or .yml files")
	}
	sort.Strings(out)
	return out, nil
}

// isPolicyName reports whether a file name has a YAML extension.
func isPolicyName(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}

// unwrapPathError drops the path from an *fs.PathError (the Error carries it).
func unwrapPathError(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
