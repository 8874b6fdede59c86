// Package volumes is the named-volume service: volume_create, volume_list,
// volume_get, volume_delete, and the volume side of sandbox_create
// {volumes}. A volume is disk that outlives sandboxes: an ext4 image with
// a journal (pkg/storage) in volumes.dir, on a loop device, mounted by the
// daemon at run_dir/volumes/<name> for as long as the volume exists; a
// sandbox gets a bind (through an idmapped clone when it runs in its own
// user namespace) of that mount at the path it asked for, read-write or
// read-only. Several sandboxes mounting one volume share one file system,
// so each sees the others' writes at once.
//
// Why an image on a loop device and not a project-quota directory: the
// same reason as a sandbox's own disk (docs/storage.md): project quotas
// need the host file system mounted with them, which the state directory's
// usually is not; an image is a hard size and inode limit anywhere.
//
// Crash safety: the row is written (state creating) before anything
// exists, and each resource — image, loop device, mount — is recorded in
// the resource ledger (owner "vol-<name>", claimed so that the sandbox
// manager's reconciliation and gc never release it) before it is acquired.
// A delete marks the row deleting before it releases anything. Load, at
// daemon start, releases what a creating or deleting volume holds and drops
// its row (a create the daemon died in was never acknowledged), and mounts
// a ready volume that is not mounted. A kill -9 at any point leaves no
// orphan and loses no acknowledged volume.
//
// Security: the volume's file system is made by the daemon and mounted
// nosuid,nodev in the host's mount namespace under run_dir (root-only);
// sandboxes reach only binds of its root directory, never the image or
// the device, so a sandbox cannot present a crafted ext4 to the host
// kernel. Mount paths inside the sandbox are checked here (CheckPath).
package volumes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Resource kinds of a volume in the ledger, and the prefix of its owner.
const (
	KindImage   = "volume-image"
	KindLoop    = "volume-loop"
	KindMount   = "volume-mount"
	OwnerPrefix = "vol-"
)

// States of a volume's row.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StateDeleting = "deleting"
)

// Crash points (internal/crashpoint) of a volume's create, after each
// acquisition.
const (
	CrashAfterRow   = "volume.row"
	CrashAfterImage = "volume.image"
	CrashAfterMount = "volume.mount"
)

// Sandboxes is what the service needs of the sandbox service: which live
// sandboxes mount a volume.
type Sandboxes interface {
	VolumeUsers(name string) []string
}

// Store keeps the volumes' rows (pkg/store/volumes.go).
type Store interface {
	InsertVolume(ctx context.Context, r *store.VolumeRecord) error
	GetVolume(ctx context.Context, name string) (*store.VolumeRecord, error)
	ListVolumes(ctx context.Context) ([]*store.VolumeRecord, error)
	SetVolumeState(ctx context.Context, name, state string) error
	DeleteVolume(ctx context.Context, name string) error
}

// Options configure the service.
type Options struct {
	Store     Store
	Sandboxes Sandboxes
	Ledger    *ledger.Ledger
	// Disks makes and discards the image files, in volumes.dir.
	Disks *storage.Store
	// MountDir is where the daemon mounts each volume (run_dir/volumes).
	MountDir string
	Config   *config.Volumes
	// Owner is the uid and gid a new volume's root directory belongs to
	// (sandbox.user), as sandboxes see it.
	Owner int
	Log   *slog.Logger
}

// Service creates, lists, describes and deletes volumes and hands them to
// sandbox creates.
type Service struct {
	opt Options

	mu sync.Mutex
	// pending counts, per volume, the sandbox creates that were given it
	// and have not yet become live sandboxes (or failed): a delete waits
	// for neither and refuses while any is pending.
	pending map[string]int
	// busy marks a volume being created or deleted by this daemon.
	busy map[string]bool
}

// New returns the service and registers its resource kinds; Load must run
// before it is used.
func New(opt Options) (*Service, error) {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if err := os.MkdirAll(opt.MountDir, 0o711); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	// Sandboxes of a user namespace (unprivileged host ids) walk through
	// the mount dir to their bind's source: search, never list.
	if err := os.Chmod(opt.MountDir, 0o711); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	s := &Service{opt: opt, pending: map[string]int{}, busy: map[string]bool{}}
	opt.Ledger.Register(KindImage, func(_ context.Context, r ledger.Resource) error { return opt.Disks.Discard(r.Key) })
	opt.Ledger.Register(KindLoop, func(_ context.Context, r ledger.Resource) error { return storage.Detach(r.Key) })
	opt.Ledger.Register(KindMount, func(_ context.Context, r ledger.Resource) error { return unmountVolume(r.Key) })
	opt.Ledger.Claim(OwnerPrefix)
	return s, nil
}

// unmountVolume unmounts a volume's mount point and removes the (then
// empty) directory. Never RemoveAll: if the unmount did not happen, the
// directory holds the volume's files.
func unmountVolume(dir string) error {
	for {
		err := unix.Unmount(dir, 0)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("unmount volume %s: %w", dir, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume mount point: %w", err)
	}
	return nil
}

func owner(name string) string { return OwnerPrefix + name }

func (s *Service) imagePath(name string) string { return s.opt.Disks.ImagePath(name) }

// MountPath is where the daemon mounts volume name.
func (s *Service) MountPath(name string) string { return filepath.Join(s.opt.MountDir, name) }

// Load finishes what a previous daemon left: a volume it was creating or
// deleting is released and forgotten, a ready one mounted if it is not.
func (s *Service) Load(ctx context.Context) error {
	recs, err := s.opt.Store.ListVolumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		switch r.State {
		case StateReady:
			if err := s.ensureMounted(r.Name); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", r.Name, err))
			}
		default:
			s.opt.Log.Info("volumes: finishing what a stopped daemon left", "volume", r.Name, "state", r.State)
			if err := s.drop(ctx, r.Name); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", r.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// drop releases everything volume name holds, then its row.
func (s *Service) drop(ctx context.Context, name string) error {
	if _, err := s.opt.Ledger.Release(ctx, owner(name)); err != nil {
		return err
	}
	return s.opt.Store.DeleteVolume(ctx, name)
}

// ensureMounted mounts volume name's file system at its mount point
// unless it is mounted there already. A loop device still backed by its
// image (held by sandboxes' binds after the mount point went) is mounted
// again rather than a second one attached: two devices of one image would
// be two ext4s writing the same blocks.
func (s *Service) ensureMounted(name string) error {
	mp := s.MountPath(name)
	if mounted(mp) {
		return nil
	}
	img := s.imagePath(name)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := os.MkdirAll(mp, 0o700); err != nil {
		return err
	}
	devs, err := storage.LoopDevices()
	if err != nil {
		return err
	}
	for dev, backing := range devs {
		if backing == img {
			return storage.MountDisk(dev, mp)
		}
	}
	dev, f, err := storage.Attach(img)
	if err != nil {
		return err
	}
	defer f.Close() // autoclear: the mount holds the device from here
	return storage.MountDisk(dev, mp)
}

// mounted reports whether dir is a mount point (another device than its
// parent's).
func mounted(dir string) bool {
	var st, pst unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &pst) != nil {
		return false
	}
	return st.Dev != pst.Dev
}

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckName refuses a volume name that is not a DNS label (1 to 63
// lowercase letters, digits and -, not starting or ending with -): it
// names a file and a directory of the host, so no '/', '.', NUL or space.
func CheckName(field, name string) error {
	if name == "" {
		return errdefs.Invalidf("%s: required", field)
	}
	if !nameRe.MatchString(name) {
		return errdefs.Invalidf("%s: %q is not 1 to 63 lowercase letters, digits and - (starting and ending with a letter or digit)", field, truncate(name))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// systemDirs may not be a volume's mount point: the sandbox's own
// programs and libraries, and the directories the daemon mounts itself.
var systemDirs = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/root", "/run", "/sbin", "/usr", "/var", "/home", "/workspace", "/tmp"}

// kernelDirs may be neither a mount point nor hold one: the kernel's
// file systems and the daemon's agent directory.
var kernelDirs = []string{"/proc", "/sys", "/dev", "/.sandboxd"}

// CheckPath refuses a mount path that is not absolute and clean (no "..",
// no "//", no trailing "/"), that is "/" or a system directory, or that
// lies below /proc, /sys, /dev or /.sandboxd (mounting over them would
// hide what the kernel or the daemon gives the sandbox). Below /workspace,
// /tmp, /home and the like is allowed.
func CheckPath(field, p string) error {
	switch {
	case p == "":
		return errdefs.Invalidf("%s: required", field)
	case len(p) > 1024:
		return errdefs.Invalidf("%s: longer than 1024 bytes", field)
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errdefs.Invalidf("%s: %q holds a control character", field, truncate(p))
	case !strings.HasPrefix(p, "/"):
		return errdefs.Invalidf("%s: %q is not an absolute path", field, truncate(p))
	case filepath.Clean(p) != p:
		return errdefs.Invalidf("%s: %q is not a clean path (no .., //, . or trailing /)", field, truncate(p))
	case p == "/":
		return errdefs.Invalidf("%s: cannot mount a volume over /", field)
	}
	for _, d := range kernelDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return errdefs.Invalidf("%s: %q is in %s, which the sandbox needs as the kernel or the daemon gives it", field, p, d)
		}
	}
	for _, d := range systemDirs {
		if p == d {
			return errdefs.Invalidf("%s: cannot mount a volume over %s itself (a directory below it is fine)", field, d)
		}
	}
	return nil
}

// visible reports whether the caller may see a volume of tenant: an
// administrator, an engine-internal call and a caller without a tenant
// see every volume; a tenant's caller sees its own.
func visible(ctx context.Context, tenant string) bool {
	p, ok := principal.From(ctx)
	return !ok || p.Admin || p.Tenant == "" || p.Tenant == tenant
}

// Create makes a volume: its row, its image, the loop device and the mount,
// each recorded before it is acquired.
func (s *Service) Create(ctx context.Context, req apitypes.VolumeCreateRequest) (*apitypes.Volume, error) {
	if err := CheckName("name", req.Name); err != nil {
		return nil, err
	}
	cfg := s.opt.Config
	size := int64(cfg.DefaultSize)
	if req.SizeMB != nil {
		const mib = 1 << 20
		lo, hi := int64(16), int64(cfg.MaxSize)/mib
		if *req.SizeMB < lo || *req.SizeMB > hi {
			return nil, errdefs.Invalidf("size_mb: must be between %d and %d (volumes.max_size), got %d", lo, hi, *req.SizeMB)
		}
		size = *req.SizeMB * mib
	}
	inodes := storage.DefaultInodes(size)
	if req.Inodes != nil {
		if *req.Inodes < 1024 || *req.Inodes > size/1024 {
			return nil, errdefs.Invalidf("inodes: must be between 1024 and %d (one per KiB of size), got %d", size/1024, *req.Inodes)
		}
		inodes = *req.Inodes
	}
	if cfg.MaxVolumes > 0 {
		all, err := s.opt.Store.ListVolumes(ctx)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "list volumes")
		}
		if len(all) >= cfg.MaxVolumes {
			return nil, errdefs.LimitExceededf("volumes.max_volumes (%d) volumes already exist", cfg.MaxVolumes)
		}
	}
	p, _ := principal.From(ctx)
	rec := &store.VolumeRecord{Name: req.Name, State: StateCreating, SizeBytes: size, Inodes: inodes,
		Tenant: p.Tenant, CreatedBy: p.KeyName, CreatedAt: time.Now().UTC()}
	s.mu.Lock()
	if s.busy[req.Name] {
		s.mu.Unlock()
		return nil, errdefs.Conflictf("name: volume %q is being created or deleted", req.Name)
	}
	s.busy[req.Name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, req.Name)
		s.mu.Unlock()
	}()
	switch err := s.opt.Store.InsertVolume(ctx, rec); {
	case errors.Is(err, store.ErrExists):
		return nil, errdefs.Conflictf("name: volume %q exists", req.Name)
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Internal, err, "record volume")
	}
	crashpoint.Hit(CrashAfterRow)
	if err := s.acquire(ctx, rec); err != nil {
		// Undo with a context of its own: the caller may have gone.
		uctx := context.WithoutCancel(ctx)
		if derr := s.drop(uctx, req.Name); derr != nil {
			s.opt.Log.Error("volumes: undo a failed create", "volume", req.Name, "err", derr)
		}
		if errdefs.CodeOf(err) == errdefs.Internal {
			return nil, errdefs.Wrap(errdefs.Internal, err, "create volume %s", req.Name)
		}
		return nil, err
	}
	if err := s.opt.Store.SetVolumeState(ctx, req.Name, StateReady); err != nil {
		if derr := s.drop(context.WithoutCancel(ctx), req.Name); derr != nil {
			s.opt.Log.Error("volumes: undo a failed create", "volume", req.Name, "err", derr)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "record volume")
	}
	rec.State = StateReady
	s.opt.Log.Info("volume created", "volume", req.Name, "size", size, "inodes", inodes, "tenant", rec.Tenant)
	v := s.public(rec)
	return &v, nil
}

// acquire makes the image, attaches it and mounts it, recording each first.
func (s *Service) acquire(ctx context.Context, rec *store.VolumeRecord) error {
	rc := s.opt.Ledger.For(owner(rec.Name))
	img := s.imagePath(rec.Name)
	if err := rc.Record(ctx, ledger.Resource{Kind: KindImage, Key: img}); err != nil {
		return err
	}
	if err := s.opt.Disks.CreateJournaledImage(ctx, img, rec.SizeBytes, rec.Inodes); err != nil {
		return err
	}
	crashpoint.Hit(CrashAfterImage)
	if err := rc.Record(ctx, ledger.Resource{Kind: KindLoop, Key: img}); err != nil {
		return err
	}
	mp := s.MountPath(rec.Name)
	if err := rc.Record(ctx, ledger.Resource{Kind: KindMount, Key: mp}); err != nil {
		return err
	}
	if err := s.ensureMounted(rec.Name); err != nil {
		return err
	}
	crashpoint.Hit(CrashAfterMount)
	// The root belongs to the sandbox user (its id as sandboxes see it:
	// idmapped binds keep ids as they are on disk), 0755.
	if err := os.Chown(mp, s.opt.Owner, s.opt.Owner); err != nil {
		return err
	}
	return os.Chmod(mp, 0o755)
}

// record returns volume name's row: not_found naming field when there is
// none or the caller may not see it.
func (s *Service) record(ctx context.Context, field, name string) (*store.VolumeRecord, error) {
	if err := CheckName(field, name); err != nil {
		return nil, err
	}
	r, err := s.opt.Store.GetVolume(ctx, name)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (r.State != StateReady || !visible(ctx, r.Tenant))) {
		return nil, errdefs.NotFoundf("%s: no volume %q", field, name)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up volume %s", name)
	}
	return r, nil
}

func (s *Service) public(r *store.VolumeRecord) apitypes.Volume {
	v := apitypes.Volume{Name: r.Name, SizeBytes: r.SizeBytes, Inodes: r.Inodes, Tenant: r.Tenant,
		CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UsedBy: s.opt.Sandboxes.VolumeUsers(r.Name)}
	if b, n, err := storage.Usage(s.MountPath(r.Name)); err == nil {
		v.UsedBytes, v.InodesUsed = b, n
	}
	return v
}

// Get describes volume name.
func (s *Service) Get(ctx context.Context, name string) (*apitypes.Volume, error) {
	r, err := s.record(ctx, "name", name)
	if err != nil {
		return nil, err
	}
	v := s.public(r)
	return &v, nil
}

// List lists the volumes the caller may see, by name.
func (s *Service) List(ctx context.Context) (*apitypes.VolumeList, error) {
	recs, err := s.opt.Store.ListVolumes(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list volumes")
	}
	out := &apitypes.VolumeList{Volumes: []apitypes.Volume{}}
	for _, r := range recs {
		if r.State == StateReady && visible(ctx, r.Tenant) {
			out.Volumes = append(out.Volumes, s.public(r))
		}
	}
	return out, nil
}

// Delete removes volume name and its files, unless a live sandbox mounts it
// (failed_precondition naming them) or a create is about to.
func (s *Service) Delete(ctx context.Context, name string) error {
	if _, err := s.record(ctx, "name", name); err != nil {
		return err
	}
	s.mu.Lock()
	if s.busy[name] {
		s.mu.Unlock()
		return errdefs.Conflictf("name: volume %q is being created or deleted", name)
	}
	if users := s.opt.Sandboxes.VolumeUsers(name); len(users) > 0 || s.pending[name] > 0 {
		s.mu.Unlock()
		if len(users) == 0 {
			return errdefs.FailedPreconditionf("name: volume %q is being mounted by a sandbox that is starting", name)
		}
		return errdefs.FailedPreconditionf("name: volume %q is mounted by live sandbox(es) %s; terminate them first", name, strings.Join(users, ", "))
	}
	s.busy[name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, name)
		s.mu.Unlock()
	}()
	// Deleting before anything is released: a crash from here on is
	// finished by the next daemon's Load, never half a volume left ready.
	if err := s.opt.Store.SetVolumeState(ctx, name, StateDeleting); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete volume %s", name)
	}
	if err := s.drop(context.WithoutCancel(ctx), name); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete volume %s", name)
	}
	s.opt.Log.Info("volume deleted", "volume", name)
	return nil
}

// Acquire resolves a create's volume mounts: each names a ready volume
// the caller may see, at a path CheckPath accepts, no path twice and none
// inside another. The volumes count as in use until release is called,
// which the caller does once the sandbox is live (its spec then names
// them) or failed.
func (s *Service) Acquire(ctx context.Context, mounts []apitypes.VolumeMount) (_ []sandbox.VolumeMount, release func(), err error) {
	release = func() {}
	if len(mounts) == 0 {
		return nil, release, nil
	}
	if max := s.opt.Config.MaxPerSandbox; len(mounts) > max {
		return nil, release, errdefs.Invalidf("volumes: %d volumes, at most %d (volumes.max_per_sandbox)", len(mounts), max)
	}
	out := make([]sandbox.VolumeMount, 0, len(mounts))
	for i, m := range mounts {
		if _, err := s.record(ctx, fmt.Sprintf("volumes[%d].name", i), m.Name); err != nil {
			return nil, release, err
		}
		if err := CheckPath(fmt.Sprintf("volumes[%d].path", i), m.Path); err != nil {
			return nil, release, err
		}
		for j, o := range mounts[:i] {
			if o.Path == m.Path || strings.HasPrefix(m.Path, o.Path+"/") || strings.HasPrefix(o.Path, m.Path+"/") {
				return nil, release, errdefs.Invalidf("volumes[%d].path: %q overlaps volumes[%d].path %q", i, m.Path, j, o.Path)
			}
		}
		out = append(out, sandbox.VolumeMount{VolumeMount: m, Source: s.MountPath(m.Name)})
	}
	s.mu.Lock()
	for _, m := range mounts {
		if s.busy[m.Name] {
			s.mu.Unlock()
			return nil, release, errdefs.Conflictf("volumes: volume %q is being deleted", m.Name)
		}
	}
	for _, m := range mounts {
		s.pending[m.Name]++
	}
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, m := range mounts {
				if s.pending[m.Name]--; s.pending[m.Name] <= 0 {
					delete(s.pending, m.Name)
				}
			}
		})
	}
	// A delete that finished between the look-up above and the count is
	// caught here; one that starts after the count refuses.
	for i, m := range mounts {
		if _, err := s.record(ctx, fmt.Sprintf("volumes[%d].name", i), m.Name); err != nil {
			release()
			return nil, func() {}, err
		}
	}
	return out, release, nil
}
