// Package snapshots is the snapshot service: sandbox_snapshot,
// sandbox_restore, the snapshot side of sandbox_create {from_snapshot},
// snapshot_list, snapshot_delete, and their expiry (the janitor). The
// archive format and its safe extraction are pkg/storage/snapshot.go; the
// freezing and job stopping are sandbox.Manager.Frozen and Replace; the
// rows are pkg/store/snapshots.go. It needs of the sandbox service only its
// Sandboxes interface and of the state database only its Store; pkg/engine
// composes it.
package snapshots

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Sandboxes is what the snapshot service needs of the sandbox service.
type Sandboxes interface {
	Get(ctx context.Context, id string) (*sandbox.Info, error)
	Frozen(ctx context.Context, id string, fn func(sandbox.WritableDirs) error) error
	Replace(ctx context.Context, id string, fn func(sandbox.WritableDirs) error) error
	Capabilities(ctx context.Context, id string) (sandbox.Capabilities, error)
	SaveMachineSnapshot(ctx context.Context, id, name string) error
	RestoreMachineSnapshot(ctx context.Context, id, name string) error
	MachineSnapshots(ctx context.Context, id string) ([]string, error)
}

// Store keeps the snapshots' rows (pkg/store/snapshots.go).
type Store interface {
	InsertSnapshot(ctx context.Context, r *store.SnapshotRecord) error
	GetSnapshot(ctx context.Context, id string) (*store.SnapshotRecord, error)
	ListSnapshots(ctx context.Context, sandboxID string) ([]*store.SnapshotRecord, error)
	SnapshotsBefore(ctx context.Context, t time.Time) ([]*store.SnapshotRecord, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Service takes, restores, lists and expires snapshots.
type Service struct {
	sandboxes Sandboxes
	store     Store
	cfg       config.Snapshots
	stateDir  string // archives go to stateDir/snapshots unless cfg.Dir is set
	log       *slog.Logger

	// snapMu: deletions and expiry hold it exclusively; taking a snapshot,
	// a fork's start and a restore hold it shared, so that the archive they
	// use cannot disappear under them.
	snapMu      sync.RWMutex
	stopJanitor context.CancelFunc
	janitorDone chan struct{}
}

// New returns the service; Start starts its janitor.
func New(sandboxes Sandboxes, st Store, cfg config.Snapshots, stateDir string, log *slog.Logger) *Service {
	return &Service{sandboxes: sandboxes, store: st, cfg: cfg, stateDir: stateDir, log: log}
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

func (s *Service) snapshotsDir() string {
	if s.cfg.Dir != "" {
		return s.cfg.Dir
	}
	return filepath.Join(s.stateDir, "snapshots")
}

func (s *Service) snapshotPath(id string) string {
	return filepath.Join(s.snapshotsDir(), id+storage.SnapshotSuffix)
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

func (s *Service) publicSnapshot(r *store.SnapshotRecord) apitypes.Snapshot {
	out := apitypes.Snapshot{
		ID: r.ID, Name: r.Name, Kind: apitypes.SnapshotFiles, SandboxID: r.SandboxID, Language: r.Language, Image: r.Image,
		ImageDigest: r.ImageDigest, DiskBacking: r.DiskBacking, Size: r.SizeBytes, ContentSize: r.ContentBytes,
		CreatedAt: r.CreatedAt, ExcludedVolumes: r.ExcludedVolumes,
	}
	if age := s.cfg.MaxAge.D(); age > 0 {
		exp := r.CreatedAt.Add(age)
		out.ExpiresAt = &exp
	}
	return out
}

// snapshotRecord returns snapshot id's row: not_found naming the field
// when there is none.
func (s *Service) snapshotRecord(ctx context.Context, id string) (*store.SnapshotRecord, error) {
	if err := checkSnapshotID(id); err != nil {
		return nil, err
	}
	r, err := s.store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !s.visible(ctx, r.SandboxID)) {
		return nil, errdefs.NotFoundf("snapshot_id: no snapshot %q", id)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up snapshot %s", id)
	}
	return r, nil
}

// visible says whether ctx's caller may see the snapshots of sandbox id: a
// snapshot belongs to the tenant of the sandbox it was taken of, which the
// sandbox service decides (an admin, or no principal: every snapshot).
func (s *Service) visible(ctx context.Context, sandboxID string) bool {
	if p, ok := principal.From(ctx); !ok || p.Admin {
		return true
	}
	_, err := s.sandboxes.Get(ctx, sandboxID)
	return err == nil
}

// liveSandbox returns sandbox id if it is live, else an error naming
// sandbox_id.
func (s *Service) liveSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	if err := sandbox.CheckID(id); err != nil {
		return nil, err
	}
	info, err := s.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !info.State.Live() || info.State == sandbox.StateCreating {
		return nil, errdefs.Conflictf("sandbox_id: sandbox %s is %s", id, info.State)
	}
	return info, nil
}

// Snapshot archives a live sandbox's writable state — /workspace,
// /tmp and its root file system's overlay upper layer — with its processes
// frozen for the time it takes, and records it. Snapshotting the same state
// twice gives the same snapshot (the id is the archive's sha256).
func (s *Service) Snapshot(ctx context.Context, req apitypes.SnapshotRequest) (*apitypes.Snapshot, error) {
	if req.Name != "" && !snapshotNameRe.MatchString(req.Name) {
		return nil, errdefs.Invalidf("name: %q is not 1 to 64 letters, digits and ._- (starting with a letter or digit)", req.Name)
	}
	info, err := s.liveSandbox(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if s.machineSnapshots(ctx, info.ID) {
		return s.snapshotMachine(ctx, info, req.Name)
	}
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	var sf *storage.SnapshotFile
	start := time.Now()
	err = s.sandboxes.Frozen(ctx, info.ID, func(d sandbox.WritableDirs) error {
		var err error
		sf, err = storage.WriteSnapshot(s.snapshotsDir(), map[string]string{
			storage.SectionUpper: d.Upper, storage.SectionWorkspace: d.Workspace, storage.SectionTmp: d.Tmp,
		}, int64(s.cfg.MaxSize), info.Limits.DiskBytes, storage.IDRange{Base: d.IDBase, Size: d.IDSize}, d.UID)
		if err == nil {
			crashpoint.Hit(CrashSnapshotFrozen)
		}
		return err
	})
	if errors.Is(err, storage.ErrSnapshotTooLarge) {
		return nil, errdefs.LimitExceededf("sandbox_id: the snapshot of %s exceeds snapshots.max_size (%v compressed)", info.ID, s.cfg.MaxSize)
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
		CreatedAt: time.Now().UTC(), ExcludedVolumes: excludedVolumes(info),
	}
	switch err := s.store.InsertSnapshot(ctx, rec); {
	case errors.Is(err, store.ErrExists):
		// The same bytes as an earlier snapshot: that one it is.
		return s.Get(ctx, sf.Digest)
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Internal, err, "record snapshot")
	}
	s.log.Info("snapshot taken", "sandbox", info.ID, "snapshot", rec.ID, "bytes", rec.SizeBytes, "content_bytes", rec.ContentBytes,
		"frozen", frozen, "duration", time.Since(start))
	out := s.publicSnapshot(rec)
	return &out, nil
}

// excludedVolumes names the volumes a sandbox mounts ("name:/path"): a
// snapshot archives the sandbox's own disk only, never a named volume,
// which outlives the sandbox and is shared with others (restoring it
// would overwrite what they wrote). The host-side walk of the sandbox's
// disk does not see them anyway: they are mounted in its mount namespace.
func excludedVolumes(info *sandbox.Info) []string {
	var out []string
	for _, v := range info.Volumes {
		out = append(out, v.Name+":"+v.Path)
	}
	return out
}

// Get describes snapshot id.
func (s *Service) Get(ctx context.Context, id string) (*apitypes.Snapshot, error) {
	r, err := s.snapshotRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	out := s.publicSnapshot(r)
	return &out, nil
}

// List lists the snapshots, of sandboxID only when it is not
// empty, newest first.
func (s *Service) List(ctx context.Context, sandboxID string) ([]apitypes.Snapshot, error) {
	if sandboxID != "" {
		if err := sandbox.CheckID(sandboxID); err != nil {
			return nil, err
		}
	}
	recs, err := s.store.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list snapshots")
	}
	out := make([]apitypes.Snapshot, 0, len(recs))
	seen := map[string]bool{}
	for _, r := range recs {
		vis, ok := seen[r.SandboxID]
		if !ok {
			vis = s.visible(ctx, r.SandboxID)
			seen[r.SandboxID] = vis
		}
		if vis {
			out = append(out, s.publicSnapshot(r))
		}
	}
	return out, nil
}

// Delete removes snapshot id: its row and its archive.
func (s *Service) Delete(ctx context.Context, id string) error {
	if _, err := s.snapshotRecord(ctx, id); err != nil {
		return err
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	return s.deleteSnapshotLocked(ctx, id)
}

func (s *Service) deleteSnapshotLocked(ctx context.Context, id string) error {
	// The row first: a crash after it leaves an archive without a row,
	// which the janitor removes; the other way round would leave a row
	// without its archive.
	err := s.store.DeleteSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFoundf("snapshot_id: no snapshot %q", id)
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete snapshot %s", id)
	}
	if err := os.Remove(s.snapshotPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.Internal, err, "remove snapshot archive %s", id)
	}
	return nil
}

// Restore rolls live sandbox req.SandboxID back to snapshot
// req.SnapshotID: its running commands are killed, its /workspace and /tmp
// are replaced by the snapshot's, and the snapshot's root file system
// changes are laid over its root. It keeps its id, limits and network.
func (s *Service) Restore(ctx context.Context, req apitypes.RestoreRequest) (*sandbox.Info, error) {
	info, err := s.liveSandbox(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if s.machineSnapshots(ctx, info.ID) {
		return s.restoreMachine(ctx, info, req.SnapshotID)
	}
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	rec, err := s.snapshotRecord(ctx, req.SnapshotID)
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
	archive := s.snapshotPath(rec.ID)
	start := time.Now()
	err = s.sandboxes.Replace(ctx, info.ID, func(d sandbox.WritableDirs) error {
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
	s.log.Info("sandbox restored", "sandbox", info.ID, "snapshot", rec.ID, "duration", time.Since(start))
	return s.sandboxes.Get(ctx, info.ID)
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

// ForkSeed resolves req.FromSnapshot for sandbox_create: the request gets
// the snapshot's language (a different one is refused), and the spec the
// archive to start from (SeedSpec). The caller keeps the snapshot with
// Hold while the sandbox starts.
func (s *Service) ForkSeed(ctx context.Context, req *apitypes.CreateSandboxRequest) (*store.SnapshotRecord, error) {
	if req.FromSnapshot == "" {
		return nil, nil
	}
	rec, err := s.snapshotRecord(ctx, req.FromSnapshot)
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

// Hold keeps snapshot id from being deleted until unlock is
// called, and checks that it still exists (errors name field).
func (s *Service) Hold(ctx context.Context, id, field string) (unlock func(), err error) {
	s.snapMu.RLock()
	if _, err := s.snapshotRecord(ctx, id); err != nil {
		s.snapMu.RUnlock()
		return nil, fieldRename(err, "snapshot_id", field)
	}
	return s.snapMu.RUnlock, nil
}

// SeedSpec points spec at the snapshot's archive after checking that its
// files fit the new sandbox's disk.
func (s *Service) SeedSpec(spec *sandbox.Spec, rec *store.SnapshotRecord) error {
	if rec.ContentBytes > spec.Limits.DiskBytes {
		return errdefs.Invalidf("disk_mb: snapshot %s holds %d MiB of files, more than the disk of %d MiB", rec.ID, rec.ContentBytes>>20, spec.Limits.DiskBytes>>20)
	}
	spec.Seed, spec.SeedSnapshot = s.snapshotPath(rec.ID), rec.ID
	return nil
}

// Start starts the janitor: it deletes snapshots older than snapshots.max_age, and
// archives no row names (a crash between writing one and recording it, or
// between deleting a row and its file), now and then periodically.
func (s *Service) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopJanitor, s.janitorDone = cancel, make(chan struct{})
	age := s.cfg.MaxAge.D()
	every := min(max(age/4, time.Second), time.Minute)
	go func() {
		defer close(s.janitorDone)
		s.sweepSnapshots(ctx, true)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.sweepSnapshots(ctx, false)
			}
		}
	}()
}

func (s *Service) Stop() {
	if s.stopJanitor != nil {
		s.stopJanitor()
		<-s.janitorDone
	}
}

// sweepSnapshots is one pass of the janitor; orphans also removes the
// archives without a row and partial writes.
func (s *Service) sweepSnapshots(ctx context.Context, orphans bool) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if age := s.cfg.MaxAge.D(); age > 0 {
		old, err := s.store.SnapshotsBefore(ctx, time.Now().Add(-age))
		if err != nil {
			s.log.Warn("list expired snapshots", "err", err)
		}
		for _, r := range old {
			if err := s.deleteSnapshotLocked(ctx, r.ID); err != nil && errdefs.CodeOf(err) != errdefs.NotFound {
				s.log.Warn("expire snapshot", "snapshot", r.ID, "err", err)
				continue
			}
			s.log.Info("snapshot expired", "snapshot", r.ID, "sandbox", r.SandboxID, "age", time.Since(r.CreatedAt).Round(time.Second))
		}
	}
	if !orphans {
		return
	}
	ents, err := os.ReadDir(s.snapshotsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("list snapshot archives", "err", err)
		}
		return
	}
	for _, ent := range ents {
		name := ent.Name()
		id, isArchive := strings.CutSuffix(name, storage.SnapshotSuffix)
		if isArchive && snapshotIDRe.MatchString(id) {
			if _, err := s.store.GetSnapshot(ctx, id); !errors.Is(err, store.ErrNotFound) {
				continue
			}
		} else if !strings.HasPrefix(name, ".partial-") {
			continue
		}
		if err := os.Remove(filepath.Join(s.snapshotsDir(), name)); err != nil {
			s.log.Warn("remove orphaned snapshot archive", "file", name, "err", err)
		} else {
			s.log.Info("removed orphaned snapshot archive", "file", name)
		}
	}
}

// machineSnapshots reports whether sandbox id's snapshots are of its whole
// machine: it can take those and no workspace snapshots (a VM, whose files
// are inside its disk). Anything else takes workspace snapshots, or is
// refused naming the file_snapshot capability.
func (s *Service) machineSnapshots(ctx context.Context, id string) bool {
	caps, err := s.sandboxes.Capabilities(ctx, id)
	return err == nil && !caps.Has(sandbox.CapFileSnapshot) && caps.Has(sandbox.CapMemorySnapshot)
}

// MachineSnapshotID is the snapshot_id of sandbox id's machine snapshot
// name: 64 hex digits like a workspace snapshot's, which sandbox_restore
// of the same sandbox takes.
func MachineSnapshotID(id, name string) string {
	sum := sha256.Sum256([]byte("machine-snapshot\x00" + id + "\x00" + name))
	return hex.EncodeToString(sum[:])
}

// snapshotMachine is sandbox_snapshot of a VM: its whole machine (memory,
// devices, disk) saved under name (a new one when empty; the same name
// replaces a snapshot), kept in the VM's disk until it is terminated.
func (s *Service) snapshotMachine(ctx context.Context, info *sandbox.Info, name string) (*apitypes.Snapshot, error) {
	if name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		name = "snap-" + hex.EncodeToString(b[:])
	}
	start := time.Now()
	if err := s.sandboxes.SaveMachineSnapshot(ctx, info.ID, name); err != nil {
		return nil, err
	}
	s.log.Info("machine snapshot taken", "sandbox", info.ID, "name", name, "duration", time.Since(start))
	return &apitypes.Snapshot{ID: MachineSnapshotID(info.ID, name), Name: name, Kind: apitypes.SnapshotMemory,
		SandboxID: info.ID, Language: info.Language, Image: info.Image, ImageDigest: info.ImageDigest, CreatedAt: time.Now().UTC()}, nil
}

// restoreMachine is sandbox_restore of a VM to one of its machine
// snapshots (snapshot_id as snapshotMachine answered it).
func (s *Service) restoreMachine(ctx context.Context, info *sandbox.Info, snapshotID string) (*sandbox.Info, error) {
	if err := checkSnapshotID(snapshotID); err != nil {
		return nil, err
	}
	names, err := s.sandboxes.MachineSnapshots(ctx, info.ID)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if MachineSnapshotID(info.ID, n) == snapshotID {
			start := time.Now()
			if err := s.sandboxes.RestoreMachineSnapshot(ctx, info.ID, n); err != nil {
				return nil, err
			}
			s.log.Info("sandbox restored", "sandbox", info.ID, "machine_snapshot", n, "duration", time.Since(start))
			return s.sandboxes.Get(ctx, info.ID)
		}
	}
	return nil, errdefs.NotFoundf("snapshot_id: sandbox %s has no machine snapshot %q (it has %d: %s)", info.ID, snapshotID, len(names), strings.Join(names, ", "))
}
