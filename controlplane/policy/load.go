package policy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"
)

// Load reads policy files and returns the set of their domains: ReadFiles,
// then the set of the domains the files hold.
func Load(paths ...string) (*Set, error) {
	files, err := ReadFiles(paths...)
	if err != nil {
		return nil, err
	}
	s := &Set{domains: make(map[string]*Domain, len(files))}
	for _, f := range files {
		s.domains[f.Domain.Name] = f.Domain
	}
	return s, nil
}

// File is one policy file: what it holds and the domain parsed from it.
type File struct {
	// Path is where the file was read.
	Path string
	// Data is the file's content.
	Data []byte
	// Domain is the policy parsed from Data.
	Domain *Domain
}

// ReadFiles reads and parses policy files. Each path is a file (read
// whatever its name) or a directory, searched recursively for *.yaml and
// *.yml files; names starting with "." are skipped (so the "..data" links
// of a Kubernetes ConfigMap volume are not read twice), and symbolic links
// to files are followed. Files are read in lexical order; each holds one
// domain, and a domain defined twice is an error naming both files. A file
// larger than MaxDocumentSize is refused without reading it whole.
//
// The files together are bounded as a set (MaxDomains, MaxSetSize,
// MaxDescriptors, MaxLimits): the first file past a bound is refused with
// one error naming it and the bound. The number and sizes of the files are
// checked before any is read. Otherwise ReadFiles reads everything before
// failing, so the ErrorList it returns names every problem in every file.
func ReadFiles(paths ...string) ([]File, error) {
	var names []string
	var errs ErrorList
	for _, p := range paths {
		found, err := Files(p)
		if err != nil {
			errs = append(errs, &Error{File: p, Problem: err.Error()})
			continue
		}
		names = append(names, found...)
	}
	var sizes SetTally
	for _, name := range names {
		st, err := os.Stat(name)
		if err != nil {
			continue // readFile says why
		}
		// A file past MaxDocumentSize is refused as such by readFile.
		if err := sizes.AddFile(name, min(st.Size(), MaxDocumentSize)); err != nil {
			return nil, append(errs, err)
		}
	}
	var files []File
	var set SetTally
	for _, name := range names {
		f, err := readFile(name)
		if err != nil {
			errs = append(errs, asList(name, err)...)
			continue
		}
		if err := set.AddDomain(name, f.Domain); err != nil {
			return nil, append(errs, err)
		}
		files = append(files, f)
	}
	errs = append(errs, Duplicates(files)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return files, nil
}

// Duplicates returns an error for each file whose domain an earlier file
// already defines, naming both files.
func Duplicates(files []File) ErrorList {
	var errs ErrorList
	first := make(map[string]string, len(files))
	for _, f := range files {
		d := f.Domain
		if prev, dup := first[d.Name]; dup {
			errs = append(errs, &Error{File: f.Path, Line: d.nameLine, Domain: d.Name, Field: "domain",
				Problem: "duplicate domain (already defined in " + prev + "): one file per domain"})
			continue
		}
		first[d.Name] = f.Path
	}
	return errs
}

// ReadDocument reads one policy document from r (a file, standard input)
// and parses it; name names it in errors.
func ReadDocument(name string, r io.Reader) (File, error) {
	data, err := ReadBounded(name, r)
	if err != nil {
		return File{}, err
	}
	d, err := Parse(name, data)
	if err != nil {
		return File{}, err
	}
	return File{Path: name, Data: data, Domain: d}, nil
}

// ReadBounded reads a policy document from r, at most MaxDocumentSize
// bytes: more is an error, found without reading further. A document that
// is not UTF-8 text (a binary file) is an error naming the line of its
// first invalid byte. name names the document in errors.
func ReadBounded(name string, r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxDocumentSize+1))
	if err != nil {
		return nil, ErrorList{{File: name, Problem: "cannot read: " + unwrapPathError(err)}}
	}
	if len(data) > MaxDocumentSize {
		return nil, ErrorList{{File: name, Problem: fmt.Sprintf(
			"policy too large: more than %d bytes: split it into several domains", MaxDocumentSize)}}
	}
	if line, ok := invalidUTF8(data); ok {
		return nil, ErrorList{{File: name, Line: line, Problem: "not valid UTF-8 text (a binary file?): a policy is a YAML document"}}
	}
	return data, nil
}

// invalidUTF8 returns the line of the first byte of data that is not part
// of valid UTF-8, and whether there is one.
func invalidUTF8(data []byte) (int, bool) {
	if utf8.Valid(data) {
		return 0, false
	}
	line := 1
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return line, true
		}
		if r == '\n' {
			line++
		}
		i += n
	}
	return line, true
}

// readFile opens and reads one policy file.
func readFile(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return File{}, ErrorList{{File: name, Problem: "cannot read: " + unwrapPathError(err)}}
	}
	defer f.Close()
	return ReadDocument(name, f)
}

// asList returns err as an ErrorList.
func asList(name string, err error) ErrorList {
	var list ErrorList
	if errors.As(err, &list) {
		return list
	}
	return ErrorList{{File: name, Problem: err.Error()}}
}

// Files returns the policy files a path names, as ReadFiles finds them: the
// file itself, or the *.yaml and *.yml files under a directory, sorted.
func Files(path string) ([]string, error) {
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
