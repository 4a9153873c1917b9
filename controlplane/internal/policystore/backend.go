package policystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Record is one domain's stored policy.
type Record struct {
	// Domain is the policy's domain.
	Domain string
	// Version is the store version at which the domain was last written.
	Version uint64
	// YAML is the policy as applied (comments and layout kept).
	YAML []byte
	// Owner is the policy file that owns the domain, "" when the store
	// owns it (ratectl). Put and Delete refuse a domain a file owns.
	Owner string
	// Source is the policy path (a -policy file or directory, as given)
	// that Owner was read through; "" when the store owns the domain.
	Source string
}

// State is the whole content of a store at one version.
type State struct {
	// Version is the store version: 0 for an empty store (never written, or
	// wiped), else the number of changes since the store was created.
	Version uint64
	// Records are the domains' policies, sorted by domain.
	Records []Record
	// Sources are the versions of the policy paths last put in force
	// (PutSources), sorted by path; nil when there are none.
	Sources []SourceRecord
}

// Guard is a precondition on a domain's version for Put and Delete
// (compare-and-set).
type Guard struct {
	// Check turns the guard on; the zero Guard always passes.
	Check bool
	// Version is the version the domain must have; 0 means the domain must
	// not exist.
	Version uint64
	// TakeOver lets Put and Delete change a domain a policy file owns (the
	// domain becomes the store's): for a domain whose file no control
	// plane reads any more. A control plane that reads the file takes the
	// domain back when it next puts its files in force.
	TakeOver bool
}

// Expect returns a guard that passes only when the domain's version is v
// (0: when the domain does not exist).
func Expect(v uint64) Guard { return Guard{Check: true, Version: v} }

// String describes the guard for logs.
func (g Guard) String() string {
	s := "any"
	if g.Check {
		s = strconv.FormatUint(g.Version, 10)
	}
	if g.TakeOver {
		s += ", taking over from a policy file"
	}
	return s
}

// Backend is where a Store keeps its policies. Every method is safe for
// concurrent use, and Put, Delete and Init are atomic: a concurrent Load sees
// all of a change or none of it.
type Backend interface {
	// Name identifies the backend in logs ("redis", "file").
	Name() string
	// Load returns the current state, read atomically.
	Load(ctx context.Context) (State, error)
	// Version returns the current store version (0 for an empty store),
	// cheaply: replicas poll it.
	Version(ctx context.Context) (uint64, error)
	// Put stores yaml as domain's policy if g holds, giving it a new store
	// version, which it returns. When the stored policy is already
	// byte-identical (and g holds) nothing is written: it returns the
	// domain's version and unchanged = true. A failed guard is a
	// *ConflictError, a domain a policy file owns an *OwnedError (unless
	// g.TakeOver); a store that is not initialized (version 0) is
	// ErrUninitialized: Init it, then Put again. What Put writes is the
	// store's (no owner).
	Put(ctx context.Context, domain string, yaml []byte, g Guard) (version uint64, unchanged bool, err error)
	// Delete removes domain's policy if g holds and returns the new store
	// version. A missing domain is ErrNotFound, a failed guard a
	// *ConflictError, a domain a policy file owns an *OwnedError (unless
	// g.TakeOver).
	Delete(ctx context.Context, domain string, g Guard) (uint64, error)
	// Init writes st into the store if, and only if, the store is empty
	// (version 0), and reports whether it did. The store's version becomes
	// st.Version, which must be at least 1 and at least every record's
	// version; each record keeps its version, owner and source, and the
	// source records are written too.
	Init(ctx context.Context, st State) (bool, error)
	// PutSources puts policy files in force, atomically: for each source,
	// the rule of SourceState (newest files win) decides, and the domains
	// written get one new store version, which it returns (0 when nothing
	// was written). A store that is not initialized is ErrUninitialized.
	PutSources(ctx context.Context, srcs []SourceState) ([]SourceResult, uint64, error)
	// Subscribe returns a channel that receives a value whenever the backend
	// learns that the store may have changed (a change notification, or a
	// reconnection after which notifications may have been missed). Hints may
	// be dropped when the channel is full and may be spurious; the Store also
	// polls Version. The channel is closed once ctx ends.
	Subscribe(ctx context.Context) <-chan struct{}
}

// ErrOwned is what an *OwnedError wraps.
var ErrOwned = errors.New("domain owned by another configuration source")

// OwnedError refuses a change to a domain that something other than the
// store configures: a policy file, or an xDS server (Options.Owner).
type OwnedError struct {
	// Domain is the domain.
	Domain string
	// Owner names the owner and where to change the domain, e.g. "the
	// policy file /etc/sluice/policies/api.yaml".
	Owner string
}

// Error says who owns the domain and where to change it.
func (e *OwnedError) Error() string {
	return fmt.Sprintf("domain %q is owned by %s: change it there (nothing was changed here)", e.Domain, e.Owner)
}

// Unwrap returns ErrOwned.
func (e *OwnedError) Unwrap() error { return ErrOwned }

// fileOwned is the *OwnedError of a domain the policy file owner owns.
func fileOwned(domain, owner string) *OwnedError {
	return &OwnedError{Domain: domain, Owner: "the policy file " + owner + " (a -policy file of the control plane)"}
}

// ErrNotFound is returned (wrapped) for a domain the store does not hold.
var ErrNotFound = errors.New("no such domain")

// ErrUninitialized is returned (wrapped) by Backend.Put when the store has
// never been initialized, or was lost (a Redis restarted without
// persistence): the Store initializes it before writing, so that the domains
// it knows are not lost.
var ErrUninitialized = errors.New("policy store not initialized")

// ErrUnavailable is returned (wrapped) when the backend cannot be reached.
var ErrUnavailable = errors.New("policy store unavailable")

// ErrClosed is returned by Store methods after Close.
var ErrClosed = errors.New("policy store closed")

// ConflictError is a failed version guard.
type ConflictError struct {
	// Domain is the domain written.
	Domain string
	// Expected is the version the caller gave.
	Expected uint64
	// Actual is the domain's version in the store; 0 when it does not exist.
	Actual uint64
}

// Error says what was expected, what the store holds, and what to do.
func (e *ConflictError) Error() string {
	var has string
	if e.Actual == 0 {
		has = "the domain does not exist"
	} else {
		has = fmt.Sprintf("the store has version %d", e.Actual)
	}
	want := fmt.Sprintf("expected version %d", e.Expected)
	if e.Expected == 0 {
		want = "expected the domain not to exist (version 0)"
	}
	return fmt.Sprintf("domain %q: %s but %s: someone else changed it; read it again (get), redo the change and retry with the new version",
		e.Domain, want, has)
}

// unavailable wraps a backend error as ErrUnavailable.
func unavailable(backend string, err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, backend, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrUnavailable, backend, err)
}
