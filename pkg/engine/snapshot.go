package engine

// Workspace snapshots: sandbox_snapshot, sandbox_restore, sandbox_create
// {from_snapshot}, snapshot_list, snapshot_delete, and their expiry. The
// archive format and its safe extraction are pkg/storage/snapshot.go; the
// freezing and job stopping are sandbox.Manager.Frozen and Replace; the
// rows are pkg/store/snapshots.go.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// snapshotState is the engine's part for snapshots.
type snapshotState struct {
	// snapMu: deletions and expiry hold it exclusively; taking a snapshot,
	// a fork's start and a restore hold it shared, so that the archive they
	// use cannot disappear under them.
	snapMu      sync.RWMutex
	stopJanitor context.CancelFunc
	janitorDone chan struct{}
}

// Crash points (internal/crashpoint) with the sandbox frozen: after the
// archive is written but not recorded, and after a restore's files are
// laid down but before the thaw.
const (
	CrashSnapshotFrozen = "snapshot.frozen"
	CrashRestoreFrozen  = "restore.frozen"
)

var (
	snapshotIDRe   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	snapshotNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

func (e *Engine) snapshotsDir() string {
	if e.cfg.Snapshots.Dir != "" {
		return e.cfg.Snapshots.Dir
	}
	return filepath.Join(e.cfg.Paths.StateDir, "snapshots")
}

func (e *Engine) snapshotPath(id string) string {
	return filepath.Join(e.snapshotsDir(), id+storage.SnapshotSuffix)
}

func checkSnapshotID(id string) error {
	if id == "" {
		return errdefs.Invalidf("snapshot_id: required")
	}
	if !snapshotIDRe.MatchString(id) {
		return errdefs.Invalidf("snapshot_id: malformed %q (64 lowercase hex digits)", id)
	}
	return nil
}

func (e *Engine) publicSnapshot(r *store.SnapshotRecord) apitypes.Snapshot {
	s := apitypes.Snapshot{
		ID: r.ID, Name: r.Name, Kind: apitypes.SnapshotFiles, SandboxID: r.SandboxID, Language: r.Language, Image: r.Image,
		ImageDigest: r.ImageDigest, DiskBacking: r.DiskBacking, Size: r.SizeBytes, ContentSize: r.ContentBytes,
		CreatedAt: r.CreatedAt,
	}
	if age := e.cfg.Snapshots.MaxAge.D(); age > 0 {
		exp := r.CreatedAt.Add(age)
		s.ExpiresAt = &exp
	}
	return s
}

// snapshotRecord returns snapshot id's row: not_found naming the field
// when there is none.
func (e *Engine) snapshotRecord(ctx context.Context, id string) (*store.SnapshotRecord, error) {
	if err := checkSnapshotID(id); err != nil {
		return nil, err
	}
	r, err := e.store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.NotFoundf("snapshot_id: no snapshot %q", id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up snapshot %s", id)
	}
	return r, nil
}

// liveSandbox returns sandbox id if it is live, else an error naming
// sandbox_id.
func (e *Engine) liveSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	if err := checkSandboxID(id); err != nil {
		return nil, err
	}
	info, err := e.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !info.State.Live() || info.State == sandbox.StateCreating {
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, info.State)
	}
	return info, nil
}

// SnapshotSandbox archives a live sandbox's writable state — /workspace,
// /tmp and its root file system's overlay upper layer — with its processes
// frozen for the time it takes, and records it. Snapshotting the same state
// twice gives the same snapshot (the id is the archive's sha256).
func (e *Engine) SnapshotSandbox(ctx context.Context, req apitypes.SnapshotRequest) (*apitypes.Snapshot, error) {
	if req.Name != "" && !snapshotNameRe.MatchString(req.Name) {
		return nil, errdefs.Invalidf("name: %q is not 1 to 64 letters, digits and ._- (starting with a letter or digit)", req.Name)
	}
	info, err := e.liveSandbox(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if e.machineSnapshots(ctx, info.ID) {
		return e.snapshotMachine(ctx, info, req.Name)
	}
	e.snapMu.RLock()
	defer e.snapMu.RUnlock()
	var sf *storage.SnapshotFile
	start := time.Now()
	err = e.sandboxes.Frozen(ctx, info.ID, func(d sandbox.WritableDirs) error {
		var err error
		sf, err = storage.WriteSnapshot(e.snapshotsDir(), map[string]string{
			storage.SectionUpper: d.Upper, storage.SectionWorkspace: d.Workspace, storage.SectionTmp: d.Tmp,
		}, int64(e.cfg.Snapshots.MaxSize), info.Limits.DiskBytes, storage.IDRange{Base: d.IDBase, Size: d.IDSize})
		if err == nil {
			crashpoint.Hit(CrashSnapshotFrozen)
		}
		return err
	})
	if errors.Is(err, storage.ErrSnapshotTooLarge) {
		return nil, errdefs.LimitExceededf("sandbox_id: the snapshot of %s exceeds snapshots.max_size (%v compressed)", info.ID, e.cfg.Snapshots.MaxSize)
	}
	if errors.Is(err, storage.ErrSnapshotContentTooLarge) {
		// Sparse files: archived (and restored) in full.
		return nil, errdefs.LimitExceededf("sandbox_id: the files of %s add up to more than its disk of %d MiB (sparse files count in full): %v",
			info.ID, info.Limits.DiskBytes>>20, err)
	}
	if err != nil {
		if errdefs.CodeOf(err) != errdefs.Internal {
			return nil, err
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "snapshot sandbox %s", info.ID)
	}
	frozen := time.Since(start)
	// Durable before it is recorded; the sandbox runs again meanwhile.
	if err := sf.Sync(); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "snapshot sandbox %s", info.ID)
	}
	rec := &store.SnapshotRecord{
		ID: sf.Digest, Name: req.Name, SandboxID: info.ID, Language: info.Language, Image: info.Image,
		ImageDigest: info.ImageDigest, DiskBacking: info.DiskBacking, SizeBytes: sf.Size, ContentBytes: sf.ContentBytes,
		CreatedAt: time.Now().UTC(),
	}
	switch err := e.store.InsertSnapshot(ctx, rec); {
	case errors.Is(err, store.ErrExists):
		// The same bytes as an earlier snapshot: that one it is.
		return e.GetSnapshot(ctx, sf.Digest)
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Internal, err, "record snapshot")
	}
	e.log.Info("snapshot taken", "sandbox", info.ID, "snapshot", rec.ID, "bytes", rec.SizeBytes, "content_bytes", rec.ContentBytes,
		"frozen", frozen, "duration", time.Since(start))
	s := e.publicSnapshot(rec)
	return &s, nil
}

// GetSnapshot describes snapshot id.
func (e *Engine) GetSnapshot(ctx context.Context, id string) (*apitypes.Snapshot, error) {
	r, err := e.snapshotRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	s := e.publicSnapshot(r)
	return &s, nil
}

// ListSnapshots lists the snapshots, of sandboxID only when it is not
// empty, newest first.
func (e *Engine) ListSnapshots(ctx context.Context, sandboxID string) ([]apitypes.Snapshot, error) {
	if sandboxID != "" {
		if err := checkSandboxID(sandboxID); err != nil {
			return nil, err
		}
	}
	recs, err := e.store.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list snapshots")
	}
	out := make([]apitypes.Snapshot, 0, len(recs))
	for _, r := range recs {
		out = append(out, e.publicSnapshot(r))
	}
	return out, nil
}

// DeleteSnapshot removes snapshot id: its row and its archive.
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := e.snapshotRecord(ctx, id); err != nil {
		return err
	}
	e.snapMu.Lock()
	defer e.snapMu.Unlock()
	return e.deleteSnapshotLocked(ctx, id)
}

func (e *Engine) deleteSnapshotLocked(ctx context.Context, id string) error {
	// The row first: a crash after it leaves an archive without a row,
	// which the janitor removes; the other way round would leave a row
	// without its archive.
	err := e.store.DeleteSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFoundf("snapshot_id: no snapshot %q", id)
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete snapshot %s", id)
	}
	if err := os.Remove(e.snapshotPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.Internal, err, "remove snapshot archive %s", id)
	}
	return nil
}

// RestoreSandbox rolls live sandbox req.SandboxID back to snapshot
// req.SnapshotID: its running commands are killed, its /workspace and /tmp
// are replaced by the snapshot's, and the snapshot's root file system
// changes are laid over its root. It keeps its id, limits and network.
func (e *Engine) RestoreSandbox(ctx context.Context, req apitypes.RestoreRequest) (*sandbox.Info, error) {
	info, err := e.liveSandbox(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if e.machineSnapshots(ctx, info.ID) {
		return e.restoreMachine(ctx, info, req.SnapshotID)
	}
	e.snapMu.RLock()
	defer e.snapMu.RUnlock()
	rec, err := e.snapshotRecord(ctx, req.SnapshotID)
	if err != nil {
		return nil, err
	}
	if rec.Image != info.Image {
		return nil, errdefs.Invalidf("snapshot_id: snapshot %s is of language %s (image %s); sandbox %s is %s (image %s)",
			rec.ID, rec.Language, rec.Image, info.ID, info.Language, info.Image)
	}
	if rec.ContentBytes > info.Limits.DiskBytes {
		return nil, errdefs.Invalidf("snapshot_id: snapshot %s holds %d MiB of files, more than sandbox %s's disk of %d MiB",
			rec.ID, rec.ContentBytes>>20, info.ID, info.Limits.DiskBytes>>20)
	}
	archive := e.snapshotPath(rec.ID)
	start := time.Now()
	err = e.sandboxes.Replace(ctx, info.ID, func(d sandbox.WritableDirs) error {
		if err := checkUpperDrift(archive, d); err != nil {
			return err
		}
		err := storage.ApplySnapshot(archive, storage.ApplyTargets{
			Rootfs: d.Rootfs, SkipRoot: d.DaemonFiles, Workspace: d.Workspace, Tmp: d.Tmp, UID: d.UID,
			IDs: storage.IDRange{Base: d.IDBase, Size: d.IDSize},
		})
		if err == nil {
			crashpoint.Hit(CrashRestoreFrozen)
		}
		return err
	})
	if err != nil {
		if errdefs.CodeOf(err) != errdefs.Internal {
			return nil, err
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "restore sandbox %s from snapshot %s (its /workspace and /tmp may be partly restored; restore again)", info.ID, rec.ID)
	}
	e.log.Info("sandbox restored", "sandbox", info.ID, "snapshot", rec.ID, "duration", time.Since(start))
	return e.sandboxes.Get(ctx, info.ID)
}

// checkUpperDrift refuses a restore that would leave root file system
// changes of the sandbox in place: a file of its upper layer that the
// snapshot's does not have. Restoring lays the snapshot's layer over the
// live overlay (overlayfs forbids changing a mounted layer directly), which
// cannot take back a change the snapshot does not mention. Sandboxes see
// their root read-only, so only the daemon writes there (DaemonFiles) and
// this does not happen with this backend today; it is checked all the same.
func checkUpperDrift(archive string, d sandbox.WritableDirs) error {
	var extra []string
	err := filepath.WalkDir(d.Upper, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(d.Upper, p)
		if rel == "." || de.IsDir() || storage.UnderAny(filepath.ToSlash(rel), d.DaemonFiles) {
			return nil
		}
		extra = append(extra, filepath.ToSlash(rel))
		return nil
	})
	if err != nil || len(extra) == 0 {
		return err
	}
	have, err := storage.SnapshotEntries(archive, storage.SectionUpper)
	if err != nil {
		return err
	}
	var missing []string
	for _, p := range extra {
		if !have[p] {
			missing = append(missing, "/"+p)
		}
	}
	if len(missing) > 0 {
		return errdefs.Conflictf("snapshot_id: the sandbox's root file system has changes the snapshot does not (%s); start a new sandbox from the snapshot instead (sandbox_create from_snapshot)", strings.Join(missing, ", "))
	}
	return nil
}

// forkSeed resolves req.FromSnapshot for CreateSandbox: the request gets
// the snapshot's language (a different one is refused), and the spec the
// archive to start from (seedSpec). The caller keeps the snapshot with
// holdSnapshot while the sandbox starts.
func (e *Engine) forkSeed(ctx context.Context, req *CreateSandboxRequest) (*store.SnapshotRecord, error) {
	if req.FromSnapshot == "" {
		return nil, nil
	}
	rec, err := e.snapshotRecord(ctx, req.FromSnapshot)
	if err != nil {
		return nil, fieldRename(err, "snapshot_id", "from_snapshot")
	}
	if req.Image != "" && req.Image != rec.Image {
		return nil, errdefs.Invalidf("image: snapshot %s is of image %s, not %s", rec.ID, rec.Image, req.Image)
	}
	if req.Language != "" && req.Language != rec.Language {
		return nil, errdefs.Invalidf("language: snapshot %s is of language %s, not %s", rec.ID, rec.Language, req.Language)
	}
	req.Language, req.Image = rec.Language, rec.Image
	return rec, nil
}

// fieldRename gives an error about field from the name to.
func fieldRename(err error, from, to string) error {
	var de *errdefs.Error
	if errors.As(err, &de) && strings.HasPrefix(de.Message, from+":") {
		return errdefs.New(de.Code, "%s", to+strings.TrimPrefix(de.Message, from))
	}
	return err
}

// holdSnapshot keeps snapshot id from being deleted until unlock is
// called, and checks that it still exists (errors name field).
func (e *Engine) holdSnapshot(ctx context.Context, id, field string) (unlock func(), err error) {
	e.snapMu.RLock()
	if _, err := e.snapshotRecord(ctx, id); err != nil {
		e.snapMu.RUnlock()
		return nil, fieldRename(err, "snapshot_id", field)
	}
	return e.snapMu.RUnlock, nil
}

// seedSpec points spec at the snapshot's archive after checking that its
// files fit the new sandbox's disk.
func (e *Engine) seedSpec(spec *sandbox.Spec, rec *store.SnapshotRecord) error {
	if rec.ContentBytes > spec.Limits.DiskBytes {
		return errdefs.Invalidf("disk_mb: snapshot %s holds %d MiB of files, more than the disk of %d MiB", rec.ID, rec.ContentBytes>>20, spec.Limits.DiskBytes>>20)
	}
	spec.Seed, spec.SeedSnapshot = e.snapshotPath(rec.ID), rec.ID
	return nil
}

// startSnapshotJanitor deletes snapshots older than snapshots.max_age, and
// archives no row names (a crash between writing one and recording it, or
// between deleting a row and its file), now and then periodically.
func (e *Engine) startSnapshotJanitor() {
	ctx, cancel := context.WithCancel(context.Background())
	e.stopJanitor, e.janitorDone = cancel, make(chan struct{})
	age := e.cfg.Snapshots.MaxAge.D()
	every := min(max(age/4, time.Second), time.Minute)
	go func() {
		defer close(e.janitorDone)
		e.sweepSnapshots(ctx, true)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				e.sweepSnapshots(ctx, false)
			}
		}
	}()
}

func (e *Engine) stopSnapshotJanitor() {
	if e.stopJanitor != nil {
		e.stopJanitor()
		<-e.janitorDone
	}
}

// sweepSnapshots is one pass of the janitor; orphans also removes the
// archives without a row and partial writes.
func (e *Engine) sweepSnapshots(ctx context.Context, orphans bool) {
	e.snapMu.Lock()
	defer e.snapMu.Unlock()
	if age := e.cfg.Snapshots.MaxAge.D(); age > 0 {
		old, err := e.store.SnapshotsBefore(ctx, time.Now().Add(-age))
		if err != nil {
			e.log.Warn("list expired snapshots", "err", err)
		}
		for _, r := range old {
			if err := e.deleteSnapshotLocked(ctx, r.ID); err != nil && errdefs.CodeOf(err) != errdefs.NotFound {
				e.log.Warn("expire snapshot", "snapshot", r.ID, "err", err)
				continue
			}
			e.log.Info("snapshot expired", "snapshot", r.ID, "sandbox", r.SandboxID, "age", time.Since(r.CreatedAt).Round(time.Second))
		}
	}
	if !orphans {
		return
	}
	ents, err := os.ReadDir(e.snapshotsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			e.log.Warn("list snapshot archives", "err", err)
		}
		return
	}
	for _, ent := range ents {
		name := ent.Name()
		id, isArchive := strings.CutSuffix(name, storage.SnapshotSuffix)
		if isArchive && snapshotIDRe.MatchString(id) {
			if _, err := e.store.GetSnapshot(ctx, id); !errors.Is(err, store.ErrNotFound) {
				continue
			}
		} else if !strings.HasPrefix(name, ".partial-") {
			continue
		}
		if err := os.Remove(filepath.Join(e.snapshotsDir(), name)); err != nil {
			e.log.Warn("remove orphaned snapshot archive", "file", name, "err", err)
		} else {
			e.log.Info("removed orphaned snapshot archive", "file", name)
		}
	}
}

// machineSnapshots reports whether sandbox id's snapshots are of its whole
// machine: it can take those and no workspace snapshots (a VM, whose files
// are inside its disk). Anything else takes workspace snapshots, or is
// refused naming the file_snapshot capability.
func (e *Engine) machineSnapshots(ctx context.Context, id string) bool {
	caps, err := e.sandboxes.Capabilities(ctx, id)
	return err == nil && !caps.Has(sandbox.CapFileSnapshot) && caps.Has(sandbox.CapMemorySnapshot)
}

// machineSnapshotID is the snapshot_id of sandbox id's machine snapshot
// name: 64 hex digits like a workspace snapshot's, which sandbox_restore
// of the same sandbox takes.
func machineSnapshotID(id, name string) string {
	sum := sha256.Sum256([]byte("machine-snapshot\x00" + id + "\x00" + name))
	return hex.EncodeToString(sum[:])
}

// snapshotMachine is sandbox_snapshot of a VM: its whole machine (memory,
// devices, disk) saved under name (a new one when empty; the same name
// replaces a snapshot), kept in the VM's disk until it is terminated.
func (e *Engine) snapshotMachine(ctx context.Context, info *sandbox.Info, name string) (*apitypes.Snapshot, error) {
	if name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		name = "snap-" + hex.EncodeToString(b[:])
	}
	start := time.Now()
	if err := e.sandboxes.SaveMachineSnapshot(ctx, info.ID, name); err != nil {
		return nil, err
	}
	e.log.Info("machine snapshot taken", "sandbox", info.ID, "name", name, "duration", time.Since(start))
	return &apitypes.Snapshot{ID: machineSnapshotID(info.ID, name), Name: name, Kind: apitypes.SnapshotMemory,
		SandboxID: info.ID, Language: info.Language, Image: info.Image, ImageDigest: info.ImageDigest, CreatedAt: time.Now().UTC()}, nil
}

// restoreMachine is sandbox_restore of a VM to one of its machine
// snapshots (snapshot_id as snapshotMachine answered it).
func (e *Engine) restoreMachine(ctx context.Context, info *sandbox.Info, snapshotID string) (*sandbox.Info, error) {
	if err := checkSnapshotID(snapshotID); err != nil {
		return nil, err
	}
	names, err := e.sandboxes.MachineSnapshots(ctx, info.ID)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if machineSnapshotID(info.ID, n) == snapshotID {
			start := time.Now()
			if err := e.sandboxes.RestoreMachineSnapshot(ctx, info.ID, n); err != nil {
				return nil, err
			}
			e.log.Info("sandbox restored", "sandbox", info.ID, "machine_snapshot", n, "duration", time.Since(start))
			return e.sandboxes.Get(ctx, info.ID)
		}
	}
	return nil, errdefs.NotFoundf("snapshot_id: sandbox %s has no machine snapshot %q (it has %d: %s)", info.ID, snapshotID, len(names), strings.Join(names, ", "))
}
