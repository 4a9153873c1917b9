package policystore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"unicode/utf8"
)

// fileFormat is the version of the file layout, written in its "format"
// field. Format 2 added the owners of domains and the sources; a file of
// format 1 is read as one without them.
const fileFormat = 2

// fileDoc is the file's content.
type fileDoc struct {
	Format   int          `json:"format"`            // fileFormat
	Version  uint64       `json:"version"`           // the store version
	Policies []filePolicy `json:"policies"`          // sorted by domain
	Sources  []fileSource `json:"sources,omitempty"` // sorted by path
}

// filePolicy is one domain in the file.
type filePolicy struct {
	Domain  string `json:"domain"`
	Version uint64 `json:"version"`
	YAML    string `json:"yaml"`
	Owner   string `json:"owner,omitempty"`
	Source  string `json:"source,omitempty"`
}

// fileSource is the version of a source's files in force.
type fileSource struct {
	Path  string `json:"path"`
	Stamp int64  `json:"stamp"`
	Hash  string `json:"hash"`
}

// File keeps policies in one local JSON file, for embedded mode (no Redis).
// Every change rewrites the file atomically: the new content goes to a
// temporary file in the same directory, which is synced and renamed over
// the old one, and the directory is synced, so a crash leaves either the old
// or the new file, never a mix. A missing file is an empty store.
//
// Changes made through this File notify its subscribers at once. Several
// processes may share the file: writes are serialized by an advisory lock
// (flock on path + ".lock", where the platform has it), and each process
// learns of the others' writes by polling Version, which stats the file and
// reads it only when it changed.
type File struct {
	path string
	lock string // the lock file's path

	mu sync.Mutex // serializes this process's writes

	cacheMu  sync.Mutex
	cacheFI  fs.FileInfo // the file as last read by Version (nil: unknown)
	cacheVer uint64      // its version

	subMu sync.Mutex
	subs  map[chan struct{}]struct{} // Subscribe channels
}

// NewFile returns a File backend for path. The directory is created (0700)
// if missing. An existing file must be readable and well formed.
func NewFile(path string) (*File, error) {
	if path == "" {
		return nil, errors.New("policystore: NewFile: empty path: name the file that holds the policies")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("policystore: %s: %v", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("policystore: create the directory of %s: %v", abs, err)
	}
	f := &File{path: abs, lock: abs + ".lock", subs: map[chan struct{}]struct{}{}}
	if _, err := f.read(); err != nil {
		return nil, err
	}
	return f, nil
}

// Name returns "file".
func (f *File) Name() string { return "file" }

// Path returns the file's absolute path.
func (f *File) Path() string { return f.path }

// read reads and checks the file; a missing file is an empty document.
func (f *File) read() (*fileDoc, error) {
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return &fileDoc{Format: fileFormat}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policystore: read %s: %v", f.path, unwrapPath(err))
	}
	doc, err := decodeFile(data)
	if err != nil {
		return nil, fmt.Errorf("policystore: %s: %v (fix or remove the file; it is not overwritten while it is unreadable)", f.path, err)
	}
	return doc, nil
}

// decodeFile parses and checks the file's content.
func decodeFile(data []byte) (*fileDoc, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc fileDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a sluice policy file: %v", err)
	}
	if dec.More() {
		return nil, errors.New("not a sluice policy file: data after the JSON document")
	}
	if doc.Format != 1 && doc.Format != fileFormat {
		return nil, fmt.Errorf("format %d: this sluice reads formats 1 and %d", doc.Format, fileFormat)
	}
	seen := make(map[string]bool, len(doc.Policies))
	for i, p := range doc.Policies {
		switch {
		case seen[p.Domain]:
			return nil, fmt.Errorf("policies[%d]: domain %q twice", i, p.Domain)
		case p.Version == 0 || p.Version > doc.Version:
			return nil, fmt.Errorf("policies[%d]: domain %q: version %d is not within 1..%d", i, p.Domain, p.Version, doc.Version)
		}
		seen[p.Domain] = true
	}
	return &doc, nil
}

// state converts the document.
func (d *fileDoc) state() State {
	st := State{Version: d.Version, Records: make([]Record, len(d.Policies))}
	for i, p := range d.Policies {
		st.Records[i] = Record{Domain: p.Domain, Version: p.Version, YAML: []byte(p.YAML), Owner: p.Owner, Source: p.Source}
	}
	for _, s := range d.Sources {
		st.Sources = append(st.Sources, SourceRecord(s))
	}
	return st
}

// setState replaces the document's content with st.
func (d *fileDoc) setState(st State) {
	d.Version = st.Version
	d.Policies = make([]filePolicy, len(st.Records))
	for i, rec := range st.Records {
		d.Policies[i] = filePolicy{Domain: rec.Domain, Version: rec.Version, YAML: string(rec.YAML), Owner: rec.Owner, Source: rec.Source}
	}
	d.Sources = nil
	for _, s := range st.Sources {
		d.Sources = append(d.Sources, fileSource(s))
	}
}

// Load reads the file.
func (f *File) Load(ctx context.Context) (State, error) {
	if err := ctx.Err(); err != nil {
		return State{}, err
	}
	doc, err := f.read()
	if err != nil {
		return State{}, err
	}
	return doc.state(), nil
}

// Version returns the file's version, reading the file only when its size,
// time or identity changed since the last call.
func (f *File) Version(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f.cacheMu.Lock()
	defer f.cacheMu.Unlock()
	fi, err := os.Stat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		f.cacheFI = nil
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("policystore: stat %s: %v", f.path, unwrapPath(err))
	}
	if prev := f.cacheFI; prev != nil && os.SameFile(prev, fi) && prev.Size() == fi.Size() && prev.ModTime().Equal(fi.ModTime()) {
		return f.cacheVer, nil
	}
	doc, err := f.read()
	if err != nil {
		return 0, err
	}
	f.cacheFI, f.cacheVer = fi, doc.Version
	return doc.Version, nil
}

// update runs change on the current document under both locks and writes
// the result atomically if change returns true.
func (f *File) update(ctx context.Context, change func(doc *fileDoc) (bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	unlock, err := lockFile(f.lock)
	if err != nil {
		return fmt.Errorf("policystore: lock %s: %v", f.lock, err)
	}
	defer unlock()
	doc, err := f.read()
	if err != nil {
		return err
	}
	write, err := change(doc)
	if err != nil || !write {
		return err
	}
	sort.Slice(doc.Policies, func(i, j int) bool { return doc.Policies[i].Domain < doc.Policies[j].Domain })
	doc.Format = fileFormat
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("policystore: encode %s: %v", f.path, err)
	}
	if err := writeAtomic(f.path, append(data, '\n')); err != nil {
		return err
	}
	f.notify()
	return nil
}

// writeAtomic replaces path with data: a temporary file in the same
// directory, fsync, rename, fsync of the directory.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("policystore: write %s: %v", path, unwrapPath(err))
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("policystore: write %s: %v", path, unwrapPath(err))
	}
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("policystore: write %s: %v", path, unwrapPath(err))
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("policystore: sync %s: %v", tmp.Name(), unwrapPath(err))
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("policystore: write %s: %v", path, unwrapPath(err))
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("policystore: replace %s: %v", path, unwrapPath(err))
	}
	if d, derr := os.Open(dir); derr == nil {
		// The rename is durable once the directory is synced. Some
		// platforms cannot sync a directory; the file itself is.
		d.Sync()
		d.Close()
	}
	return nil
}

// find returns the index of domain in doc, or -1.
func (d *fileDoc) find(domain string) int {
	for i, p := range d.Policies {
		if p.Domain == domain {
			return i
		}
	}
	return -1
}

// Put writes domain's policy if g holds.
func (f *File) Put(ctx context.Context, domain string, yaml []byte, g Guard) (uint64, bool, error) {
	if !utf8.Valid(yaml) {
		return 0, false, fmt.Errorf("policystore: domain %q: the policy is not valid UTF-8", domain)
	}
	var version uint64
	var unchanged bool
	err := f.update(ctx, func(doc *fileDoc) (bool, error) {
		if doc.Version == 0 {
			return false, fmt.Errorf("file %s: %w", f.path, ErrUninitialized)
		}
		i := doc.find(domain)
		var cur uint64
		owned := false
		if i >= 0 {
			cur = doc.Policies[i].Version
			if o := doc.Policies[i].Owner; o != "" {
				if !g.TakeOver {
					return false, fileOwned(domain, o)
				}
				owned = true
			}
		}
		if g.Check && g.Version != cur {
			return false, &ConflictError{Domain: domain, Expected: g.Version, Actual: cur}
		}
		if i >= 0 && !owned && doc.Policies[i].YAML == string(yaml) {
			version, unchanged = cur, true
			return false, nil
		}
		doc.Version++
		version = doc.Version
		p := filePolicy{Domain: domain, Version: version, YAML: string(yaml)}
		if i >= 0 {
			doc.Policies[i] = p
		} else {
			doc.Policies = append(doc.Policies, p)
		}
		return true, nil
	})
	if err != nil {
		return 0, false, err
	}
	return version, unchanged, nil
}

// Delete removes domain's policy if g holds.
func (f *File) Delete(ctx context.Context, domain string, g Guard) (uint64, error) {
	var version uint64
	err := f.update(ctx, func(doc *fileDoc) (bool, error) {
		i := doc.find(domain)
		if i < 0 {
			return false, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
		}
		if o := doc.Policies[i].Owner; o != "" && !g.TakeOver {
			return false, fileOwned(domain, o)
		}
		if cur := doc.Policies[i].Version; g.Check && g.Version != cur {
			return false, &ConflictError{Domain: domain, Expected: g.Version, Actual: cur}
		}
		doc.Policies = append(doc.Policies[:i], doc.Policies[i+1:]...)
		doc.Version++
		version = doc.Version
		return true, nil
	})
	return version, err
}

// Init writes st if the file holds no version yet.
func (f *File) Init(ctx context.Context, st State) (bool, error) {
	if err := checkInitState(st); err != nil {
		return false, err
	}
	for _, rec := range st.Records {
		if !utf8.Valid(rec.YAML) {
			return false, fmt.Errorf("policystore: Init: domain %q: the policy is not valid UTF-8", rec.Domain)
		}
	}
	done := false
	err := f.update(ctx, func(doc *fileDoc) (bool, error) {
		if doc.Version != 0 {
			return false, nil
		}
		doc.setState(st)
		done = true
		return true, nil
	})
	return done, err
}

// PutSources applies the rule of SourceState to the file.
func (f *File) PutSources(ctx context.Context, srcs []SourceState) ([]SourceResult, uint64, error) {
	for _, src := range srcs {
		for _, rec := range src.Records {
			if !utf8.Valid(rec.YAML) {
				return nil, 0, fmt.Errorf("policystore: domain %q: the policy is not valid UTF-8", rec.Domain)
			}
		}
	}
	var res []SourceResult
	var version uint64
	err := f.update(ctx, func(doc *fileDoc) (bool, error) {
		if doc.Version == 0 {
			return false, fmt.Errorf("file %s: %w", f.path, ErrUninitialized)
		}
		st, out, changed, recorded := applySources(doc.state(), srcs)
		res = out
		if changed {
			version = st.Version
		}
		doc.setState(st)
		return changed || recorded, nil
	})
	if err != nil {
		return nil, 0, err
	}
	return res, version, nil
}

// Subscribe returns a channel that is hinted after each change made through
// f. Other processes' changes are found by polling Version.
func (f *File) Subscribe(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	f.subMu.Lock()
	f.subs[ch] = struct{}{}
	f.subMu.Unlock()
	go func() {
		<-ctx.Done()
		f.subMu.Lock()
		delete(f.subs, ch)
		close(ch)
		f.subMu.Unlock()
	}()
	return ch
}

// notify hints every subscriber.
func (f *File) notify() {
	f.subMu.Lock()
	defer f.subMu.Unlock()
	for ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// unwrapPath drops the path from an *fs.PathError (the message names it).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}
