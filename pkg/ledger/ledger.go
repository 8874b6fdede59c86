// Package ledger keeps, per sandbox, the list of everything it holds outside
// the database — cgroups, overlay mounts, state directories, the container,
// and next network namespaces, veth pairs, IP leases, nftables elements,
// QEMU processes and their sockets — persisted in SQLite as each resource is
// acquired.
//
// Write-ahead: a resource is recorded before it is acquired, so a crash at
// any point leaves a ledger that names everything that may exist (and
// possibly one thing that does not yet). Releasing walks an owner's entries
// in reverse acquisition order and calls the releaser registered for each
// kind; the entries whose release succeeded are deleted together after the
// walk (never before their resource is gone), and releasers treat
// "already gone" as success. A kind may release in two parts
// (RegisterStaged): the second runs while the walk goes on and is waited
// for before the rows are struck. Terminate, start-up reconciliation and garbage
// collection all release through Release: there is one cleanup routine.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	rtrace "runtime/trace"
	"strings"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Resource is one thing a sandbox holds.
type Resource struct {
	// Kind selects the releaser ("container", "cgroup", "layers", "dir", ...).
	Kind string `json:"kind"`
	// Key names the resource: a path, a device, an address, an id.
	Key string `json:"key"`
	// Data is anything else the releaser needs, as JSON.
	Data json.RawMessage `json:"data,omitempty"`
}

func (r Resource) String() string { return r.Kind + " " + r.Key }

// Releaser releases one resource. It must succeed when the resource is
// already gone.
type Releaser func(ctx context.Context, r Resource) error

// StagedReleaser releases one resource in two parts: the first, in the
// walk's order, is what every older resource waits for (the processes of
// a container are gone before its file systems are unmounted); finish
// (nil: nothing more) runs at the same time as the rest of the walk and
// must be over before the resource counts as released (a container's
// cgroups and state). Both must succeed when the resource is already gone.
type StagedReleaser func(ctx context.Context, r Resource) (finish func() error, err error)

// Ledger records resources in the store and releases them.
type Ledger struct {
	db *store.Store

	mu        sync.RWMutex
	releasers map[string]StagedReleaser
	claimed   []string // owner prefixes a service releases itself
}

// New returns a ledger kept in db.
func New(db *store.Store) *Ledger {
	return &Ledger{db: db, releasers: map[string]StagedReleaser{}}
}

// Register sets the releaser of a kind of resource. Each subsystem registers
// the kinds it acquires when it is set up.
func (l *Ledger) Register(kind string, rel Releaser) {
	l.RegisterStaged(kind, func(ctx context.Context, r Resource) (func() error, error) {
		return nil, rel(ctx, r)
	})
}

// RegisterStaged sets a two-part releaser of a kind (StagedReleaser).
func (l *Ledger) RegisterStaged(kind string, rel StagedReleaser) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releasers[kind] = rel
}

// Known reports whether kind has a releaser.
func (l *Ledger) Known(kind string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	_, ok := l.releasers[kind]
	return ok
}

// Claim marks the owners whose names start with prefix as a service's own
// (named volumes: "vol-"): they belong to no sandbox and outlive every one,
// so the sandbox manager's reconciliation and garbage collection, which
// release every owner that is not a live sandbox, leave them alone. The
// service releases them through Release like anyone else.
func (l *Ledger) Claim(prefix string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claimed = append(l.claimed, prefix)
}

// Claimed reports whether owner belongs to a service that claimed it.
func (l *Ledger) Claimed(owner string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, p := range l.claimed {
		if strings.HasPrefix(owner, p) {
			return true
		}
	}
	return false
}

// Record notes that owner is about to acquire r. Recording a resource twice
// is harmless.
func (l *Ledger) Record(ctx context.Context, owner string, r Resource) error {
	if !l.Known(r.Kind) {
		return fmt.Errorf("ledger: no releaser for kind %q", r.Kind)
	}
	defer rtrace.StartRegion(ctx, "ledger.record").End()
	return l.db.AddLedgerEntry(ctx, &store.LedgerEntry{Owner: owner, Kind: r.Kind, Key: r.Key, Data: r.Data})
}

// Recorder binds a ledger to one owner: what a backend is handed to record
// a sandbox's resources with.
type Recorder struct {
	l     *Ledger
	owner string
}

// For returns the recorder of owner.
func (l *Ledger) For(owner string) Recorder { return Recorder{l: l, owner: owner} }

// Record notes that the owner is about to acquire r.
func (r Recorder) Record(ctx context.Context, res Resource) error {
	return r.l.Record(ctx, r.owner, res)
}

// Owner is the id the recorder records for.
func (r Recorder) Owner() string { return r.owner }

// Resources lists owner's resources in acquisition order.
func (l *Ledger) Resources(ctx context.Context, owner string) ([]Resource, error) {
	ents, err := l.db.LedgerEntries(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Resource, len(ents))
	for i, e := range ents {
		out[i] = Resource{Kind: e.Kind, Key: e.Key, Data: e.Data}
	}
	return out, nil
}

// Owners lists every owner holding at least one resource.
func (l *Ledger) Owners(ctx context.Context) ([]string, error) { return l.db.LedgerOwners(ctx) }

// Released is what Release did with one resource.
type Released struct {
	Resource Resource
	Err      error // nil: released and struck from the ledger
}

// Release releases owner's recorded resources, newest first, and then the
// extra ones (found on the host by a scan, not recorded), each at most once.
// Every release is attempted even when an earlier one failed; a failed entry
// stays in the ledger for the next attempt (gc). The released entries are
// struck in one transaction after the walk. The returned error joins
// the failures.
func (l *Ledger) Release(ctx context.Context, owner string, extra ...Resource) ([]Released, error) {
	ents, err := l.db.LedgerEntries(ctx, owner)
	if err != nil {
		return nil, err
	}
	var (
		out  []Released
		errs []error
		seen = map[[2]string]bool{}
	)
	releaser := func(r Resource) StagedReleaser {
		l.mu.RLock()
		defer l.mu.RUnlock()
		return l.releasers[r.Kind]
	}
	// pending are the finishing parts of staged releases, running while
	// the walk goes on; each reports into its own channel.
	type pendingFinish struct {
		seq  int64
		at   int // index in out
		done chan error
	}
	var pending []pendingFinish
	// release runs r's releaser; a finishing part is started and, when
	// wait, waited for (resources found by a scan: nothing follows them).
	release := func(r Resource, seq int64, wait bool) (started bool, err error) {
		rel := releaser(r)
		if rel == nil {
			return false, fmt.Errorf("no releaser for kind %q", r.Kind)
		}
		finish, err := rel(ctx, r)
		if err != nil || finish == nil {
			return false, err
		}
		if wait {
			return false, finish()
		}
		done := make(chan error, 1)
		go func() { done <- finish() }()
		pending = append(pending, pendingFinish{seq: seq, at: len(out), done: done})
		return true, nil
	}
	// The rows of the released resources are struck together once every
	// release was attempted: one commit instead of one per resource. A row
	// still goes only after its resource is gone; a crash before the commit
	// leaves rows of resources already released, which the next release
	// finds gone (success) and strikes.
	var (
		done []int64 // seqs of released entries
		at   []int   // their index in out
	)
	for i := len(ents) - 1; i >= 0; i-- {
		e := ents[i]
		r := Resource{Kind: e.Kind, Key: e.Key, Data: e.Data}
		seen[[2]string{r.Kind, r.Key}] = true
		reg := rtrace.StartRegion(ctx, "release."+r.Kind)
		started, err := release(r, e.Seq, false)
		reg.End()
		switch {
		case err != nil:
			err = fmt.Errorf("release %s of %s: %w", r, owner, err)
			errs = append(errs, err)
		case !started:
			done, at = append(done, e.Seq), append(at, len(out))
		}
		out = append(out, Released{Resource: r, Err: err})
	}
	if len(pending) > 0 {
		reg := rtrace.StartRegion(ctx, "release.finish")
		for _, p := range pending {
			if err := <-p.done; err != nil {
				err = fmt.Errorf("release %s of %s: %w", out[p.at].Resource, owner, err)
				errs = append(errs, err)
				out[p.at].Err = err
				continue
			}
			done, at = append(done, p.seq), append(at, p.at)
		}
		reg.End()
	}
	if len(done) > 0 {
		reg := rtrace.StartRegion(ctx, "ledger.delete")
		err := l.db.DeleteLedgerEntries(ctx, done...)
		reg.End()
		if err != nil {
			// Released but still recorded: the next release finds them gone.
			errs = append(errs, fmt.Errorf("strike released resources of %s: %w", owner, err))
			for _, i := range at {
				out[i].Err = err
			}
		}
	}
	for _, r := range extra {
		if seen[[2]string{r.Kind, r.Key}] {
			continue
		}
		seen[[2]string{r.Kind, r.Key}] = true
		_, err := release(r, 0, true)
		if err != nil {
			err = fmt.Errorf("release %s of %s: %w", r, owner, err)
			errs = append(errs, err)
		}
		out = append(out, Released{Resource: r, Err: err})
	}
	return out, errors.Join(errs...)
}
