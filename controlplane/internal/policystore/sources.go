package policystore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/controlplane/policy"
)

// Policy files own their domains. Each -policy path (a file or a directory,
// named as given: every replica of a deployment gives the same one) is a
// source; the store keeps, per source, the version of its files in force:
// when they last changed and a hash of them. A replica puts its files in
// force at start, on SIGHUP and when they change, and the newest files win:
// a replica whose files are older than the version in force (an old pod
// that restarts during a rollout) changes nothing and serves what is in
// force. docs/design.md says why the files' change time, not the order in
// which replicas start, decides.

// SourceRecord is the version of one source in force.
type SourceRecord struct {
	// Path is the source's path, as given (-policy, RUNTIME_ROOT).
	Path string
	// Stamp is when the source's files last changed (Unix ns): the newest
	// change time of the path and of each file under it.
	Stamp int64
	// Hash is the hex SHA-256 of the files' names and contents.
	Hash string
}

// order places r among the versions of its source: by stamp, then by hash
// (which breaks a tie the same way on every replica). Two orders compare
// as strings as they do as versions, so the Redis scripts compare them as
// strings too.
func (r SourceRecord) order() string { return fmt.Sprintf("%020d %s", max(r.Stamp, 0), r.Hash) }

// parseOrder reads a source record stored as its order.
func parseOrder(path, s string) (SourceRecord, error) {
	stamp, hash, ok := strings.Cut(s, " ")
	n, err := strconv.ParseInt(stamp, 10, 64)
	if !ok || err != nil {
		return SourceRecord{}, fmt.Errorf("policystore: source %q: not a stored version: %q", path, s)
	}
	return SourceRecord{Path: path, Stamp: n, Hash: hash}, nil
}

// SourceState is one source's files as Backend.PutSources writes them.
//
// The rule, for each source S: when the store holds a version of S with
// other files (another hash) and a later order, S is Older and nothing of
// it is written. Otherwise S is put in force: each of its domains is
// written (owned by its file, with the new store version) unless the store
// holds it byte for byte already, or another source whose version in force
// is later owns it (Kept); the domains S owned that its files no longer
// name are deleted; and S's record becomes this version (the later stamp
// is kept when the files are the same).
type SourceState struct {
	SourceRecord
	// Records are the source's domains: Domain, YAML and Owner (the file
	// that holds the domain); Version and Source are ignored.
	Records []Record
}

// Outcome is what PutSources did with one source.
type Outcome int

// Outcomes.
const (
	// InForce: the source's files are in force (the domains that differed
	// were written).
	InForce Outcome = iota + 1
	// Older: the store holds a later version of the source, whose files
	// changed after these: nothing was written.
	Older
)

// String names the outcome for logs.
func (o Outcome) String() string {
	switch o {
	case InForce:
		return "in force"
	case Older:
		return "older than the version in force"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// SourceResult is what PutSources did with one source.
type SourceResult struct {
	// Path is the source's path.
	Path string
	// Outcome is InForce or Older.
	Outcome Outcome
	// Record is the source's version in force: this one, or (Older) the
	// later one the store holds.
	Record SourceRecord
	// Changed, Unchanged and Deleted are the domains written, found
	// byte-identical and deleted (InForce only).
	Changed, Unchanged, Deleted []string
	// Kept are the source's domains that a later version of another
	// source owns, left as they are.
	Kept []string
}

// applySources applies the rule of SourceState to st, in memory (the File
// backend; the Redis backend runs the same rule in files.lua). It returns
// the new state, what it did, and whether any domain changed (the store
// version is then st.Version+1) or only source records did.
func applySources(st State, srcs []SourceState) (State, []SourceResult, bool, bool) {
	recs := make(map[string]Record, len(st.Records))
	for _, r := range st.Records {
		recs[r.Domain] = r
	}
	sources := make(map[string]SourceRecord, len(st.Sources))
	for _, r := range st.Sources {
		sources[r.Path] = r
	}
	results := make([]SourceResult, len(srcs))
	recordsChanged := false
	for i, src := range srcs {
		res := &results[i]
		res.Path = src.Path
		cur, ok := sources[src.Path]
		if ok && cur.Hash != src.Hash && src.order() < cur.order() {
			res.Outcome, res.Record = Older, cur
			continue
		}
		rec := src.SourceRecord
		if ok && cur.Hash == src.Hash && cur.order() > rec.order() {
			rec = cur
		}
		recordsChanged = recordsChanged || rec != cur
		sources[src.Path] = rec
		res.Outcome, res.Record = InForce, rec
	}
	v := st.Version + 1
	changed := false
	for i, src := range srcs {
		res := &results[i]
		if res.Outcome != InForce {
			continue
		}
		named := make(map[string]bool, len(src.Records))
		for _, r := range src.Records {
			named[r.Domain] = true
			e, ok := recs[r.Domain]
			if ok && e.Source != "" && e.Source != src.Path {
				if q, ok := sources[e.Source]; ok && q.order() > res.Record.order() {
					res.Kept = append(res.Kept, r.Domain)
					continue
				}
			}
			if ok && bytes.Equal(e.YAML, r.YAML) && e.Owner == r.Owner && e.Source == src.Path {
				res.Unchanged = append(res.Unchanged, r.Domain)
				continue
			}
			recs[r.Domain] = Record{Domain: r.Domain, Version: v, YAML: r.YAML, Owner: r.Owner, Source: src.Path}
			res.Changed = append(res.Changed, r.Domain)
			changed = true
		}
		for name, e := range recs {
			if e.Source == src.Path && !named[name] {
				delete(recs, name)
				res.Deleted = append(res.Deleted, name)
				changed = true
			}
		}
		sort.Strings(res.Deleted)
	}
	out := State{Version: st.Version, Records: make([]Record, 0, len(recs))}
	if changed {
		out.Version = v
	}
	for _, r := range recs {
		out.Records = append(out.Records, r)
	}
	sort.Slice(out.Records, func(i, j int) bool { return out.Records[i].Domain < out.Records[j].Domain })
	for _, r := range sources {
		out.Sources = append(out.Sources, r)
	}
	sort.Slice(out.Sources, func(i, j int) bool { return out.Sources[i].Path < out.Sources[j].Path })
	return out, results, changed, recordsChanged
}

// Source is one policy path and the files under it, as ReadSources reads
// them, for Store.PutFiles and Options.Files.
type Source struct {
	// Path is the path as given (-policy, RUNTIME_ROOT): the source's
	// name, the same on every replica of a deployment.
	Path string
	// Stamp is when the path or one of its files last changed: the later
	// of the modification and the status change time (the change time
	// moves when a file is written, copied, moved or touched, and nothing
	// sets it back; Kubernetes writes a ConfigMap volume's files anew for
	// each pod and each update). SIGHUP raises it to the time of the
	// signal.
	Stamp time.Time
	// Files are its policy files, each holding one domain.
	Files []policy.File
}

// ReadSources reads the policy files under paths, validated together as
// policy.ReadFiles does (nothing is returned when any is invalid), as one
// Source per path.
func ReadSources(paths ...string) ([]Source, error) {
	files, err := policy.ReadFiles(paths...)
	if err != nil {
		return nil, err
	}
	out := make([]Source, len(paths))
	for i, p := range paths {
		out[i].Path = filepath.Clean(p)
		if fi, err := os.Stat(p); err == nil {
			out[i].Stamp = changeTime(fi)
		}
	}
	for _, f := range files {
		i := sourceOf(out, f.Path)
		out[i].Files = append(out[i].Files, f)
		if fi, err := os.Stat(f.Path); err == nil {
			if t := changeTime(fi); t.After(out[i].Stamp) {
				out[i].Stamp = t
			}
		}
	}
	return out, nil
}

// sourceOf returns the index of the source a file found under it belongs
// to: the path itself, or the directory it is under.
func sourceOf(srcs []Source, file string) int {
	file = filepath.Clean(file)
	for i, s := range srcs {
		if file == s.Path || strings.HasPrefix(file, s.Path+string(filepath.Separator)) {
			return i
		}
	}
	return 0 // cannot happen: policy.ReadFiles finds files under the paths
}

// state returns the source as PutSources takes it.
func (s Source) state() SourceState {
	h := sha256.New()
	st := SourceState{SourceRecord: SourceRecord{Path: s.Path, Stamp: s.Stamp.UnixNano()}}
	for _, f := range s.Files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Path), f.Path, len(f.Data))
		h.Write(f.Data)
		st.Records = append(st.Records, Record{Domain: f.Domain.Name, YAML: f.Data, Owner: f.Path})
	}
	st.Hash = hex.EncodeToString(h.Sum(nil))
	return st
}
