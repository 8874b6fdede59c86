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
// Names are per tenant: a volume is (tenant, name), so two tenants may
// each have a "data" and a create that clashes reveals only the caller's
// own volumes. A caller names its own tenant's volumes; callers who see
// every tenant (admins, the socket) may also name another's as
// "tenant:name", and an unqualified name no volume of theirs has resolves
// to the one volume of that name of any tenant (ambiguous: they are told
// to qualify it). On the host a volume's files — image, mount point,
// ledger owner — are named by its storage name (store.VolumeRecord.Storage):
// the name and a random suffix, unique whatever the tenant.
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
	"crypto/rand"
	"encoding/hex"
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
// sandboxes mount a volume (by its mount path).
type Sandboxes interface {
	VolumeUsers(source string) []string
}

// Store keeps the volumes' rows (pkg/store/volumes.go).
type Store interface {
	InsertVolume(ctx context.Context, r *store.VolumeRecord) error
	GetVolume(ctx context.Context, tenant, name string) (*store.VolumeRecord, error)
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
	// pending counts, per volume (storage name), the sandbox creates that were given it
	// and have not yet become live sandboxes (or failed): a delete waits
	// for neither and refuses while any is pending.
	pending map[string]int
	// busy marks a volume (tenant:name) being created or deleted by this
	// daemon.
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

// The files of a volume are named by its storage name.

func owner(storage string) string { return OwnerPrefix + storage }

func (s *Service) imagePath(storage string) string { return s.opt.Disks.ImagePath(storage) }

// MountPath is where the daemon mounts the volume of storage name storage.
func (s *Service) MountPath(storage string) string { return filepath.Join(s.opt.MountDir, storage) }

// storageName is a new volume's storage name: its name (for whoever reads
// the host's directories) and a random suffix ('.' is not in names, so it
// never equals the storage name of a volume made before tenants, which is
// its name).
func storageName(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	return name + "." + hex.EncodeToString(b[:])
}

// busyKey is a volume's key in busy: its tenant and name.
func busyKey(tenant, name string) string { return tenant + ":" + name }

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
			if err := s.ensureMounted(r.Storage); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", r.Name, err))
			}
		default:
			s.opt.Log.Info("volumes: finishing what a stopped daemon left", "volume", r.Name, "tenant", r.Tenant, "state", r.State)
			if err := s.drop(ctx, r.Storage); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", r.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// drop releases everything the volume of storage name storage holds,
// then its row.
func (s *Service) drop(ctx context.Context, storage string) error {
	if _, err := s.opt.Ledger.Release(ctx, owner(storage)); err != nil {
		return err
	}
	return s.opt.Store.DeleteVolume(ctx, storage)
}

// ensureMounted mounts the file system of the volume of storage name name at its mount point
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

// seesAll says whether the caller sees every tenant's volumes.
func seesAll(ctx context.Context) bool {
	p, ok := principal.From(ctx)
	return !ok || p.Admin || p.Tenant == ""
}

// tenantOf is the tenant whose names the caller's names are.
func tenantOf(ctx context.Context) string {
	p, _ := principal.From(ctx)
	return p.Tenant
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
	rec := &store.VolumeRecord{Name: req.Name, Storage: storageName(req.Name), State: StateCreating, SizeBytes: size, Inodes: inodes,
		Tenant: p.Tenant, CreatedBy: p.KeyName, CreatedAt: time.Now().UTC()}
	bk := busyKey(rec.Tenant, rec.Name)
	s.mu.Lock()
	if s.busy[bk] {
		s.mu.Unlock()
		return nil, errdefs.Conflictf("name: volume %q is being created or deleted", req.Name)
	}
	s.busy[bk] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, bk)
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
		if derr := s.drop(uctx, rec.Storage); derr != nil {
			s.opt.Log.Error("volumes: undo a failed create", "volume", req.Name, "err", derr)
		}
		if errdefs.CodeOf(err) == errdefs.Internal {
			return nil, errdefs.Wrap(errdefs.Internal, err, "create volume %s", req.Name)
		}
		return nil, err
	}
	if err := s.opt.Store.SetVolumeState(ctx, rec.Storage, StateReady); err != nil {
		if derr := s.drop(context.WithoutCancel(ctx), rec.Storage); derr != nil {
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
	rc := s.opt.Ledger.For(owner(rec.Storage))
	img := s.imagePath(rec.Storage)
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
	mp := s.MountPath(rec.Storage)
	if err := rc.Record(ctx, ledger.Resource{Kind: KindMount, Key: mp}); err != nil {
		return err
	}
	if err := s.ensureMounted(rec.Storage); err != nil {
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

// record returns the row of the volume the caller names: not_found naming
// field when there is none or the caller may not see it. A tenant's
// caller names its own tenant's volumes; a caller who sees every tenant
// names its own, another tenant's as "tenant:name", or — for a name none
// of its own has — the one volume of that name of any tenant.
func (s *Service) record(ctx context.Context, field, name string) (*store.VolumeRecord, error) {
	tenant, bare, qualified := strings.Cut(name, ":")
	if !qualified {
		tenant, bare = tenantOf(ctx), name
	} else if !seesAll(ctx) {
		return nil, errdefs.Invalidf("%s: %q: only an admin names another tenant's volume (tenant:name)", field, truncate(name))
	}
	if err := CheckName(field, bare); err != nil {
		return nil, err
	}
	notFound := errdefs.NotFoundf("%s: no volume %q", field, name)
	r, err := s.opt.Store.GetVolume(ctx, tenant, bare)
	if errors.Is(err, store.ErrNotFound) && !qualified && seesAll(ctx) {
		r, err = s.onlyOne(ctx, field, bare)
		if errdefs.CodeOf(err) == errdefs.InvalidArgument {
			return nil, err
		}
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && (r.State != StateReady || !visible(ctx, r.Tenant))) {
		return nil, notFound
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "look up volume %s", name)
	}
	return r, nil
}

// onlyOne finds the one ready volume called name of any tenant:
// store.ErrNotFound when there is none, invalid_argument naming the
// tenants when there are several.
func (s *Service) onlyOne(ctx context.Context, field, name string) (*store.VolumeRecord, error) {
	all, err := s.opt.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	var found []*store.VolumeRecord
	var tenants []string
	for _, r := range all {
		if r.Name == name && r.State == StateReady {
			found = append(found, r)
			tenants = append(tenants, fmt.Sprintf("%q", r.Tenant))
		}
	}
	switch len(found) {
	case 0:
		return nil, store.ErrNotFound
	case 1:
		return found[0], nil
	}
	return nil, errdefs.Invalidf("%s: tenants %s each have a volume %q: name one as tenant:%s", field, strings.Join(tenants, ", "), name, name)
}

func (s *Service) public(r *store.VolumeRecord) apitypes.Volume {
	v := apitypes.Volume{Name: r.Name, SizeBytes: r.SizeBytes, Inodes: r.Inodes, Tenant: r.Tenant,
		CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, UsedBy: s.opt.Sandboxes.VolumeUsers(s.MountPath(r.Storage))}
	if b, n, err := storage.Usage(s.MountPath(r.Storage)); err == nil {
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
	r, err := s.record(ctx, "name", name)
	if err != nil {
		return err
	}
	bk := busyKey(r.Tenant, r.Name)
	s.mu.Lock()
	if s.busy[bk] {
		s.mu.Unlock()
		return errdefs.Conflictf("name: volume %q is being created or deleted", name)
	}
	if users := s.opt.Sandboxes.VolumeUsers(s.MountPath(r.Storage)); len(users) > 0 || s.pending[r.Storage] > 0 {
		s.mu.Unlock()
		if len(users) == 0 {
			return errdefs.FailedPreconditionf("name: volume %q is being mounted by a sandbox that is starting", name)
		}
		return errdefs.FailedPreconditionf("name: volume %q is mounted by live sandbox(es) %s; terminate them first", name, strings.Join(users, ", "))
	}
	s.busy[bk] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, bk)
		s.mu.Unlock()
	}()
	// Deleting before anything is released: a crash from here on is
	// finished by the next daemon's Load, never half a volume left ready.
	if err := s.opt.Store.SetVolumeState(ctx, r.Storage, StateDeleting); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete volume %s", name)
	}
	if err := s.drop(context.WithoutCancel(ctx), r.Storage); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete volume %s", name)
	}
	s.opt.Log.Info("volume deleted", "volume", r.Name, "tenant", r.Tenant)
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
	recs := make([]*store.VolumeRecord, len(mounts))
	for i, m := range mounts {
		r, err := s.record(ctx, fmt.Sprintf("volumes[%d].name", i), m.Name)
		if err != nil {
			return nil, release, err
		}
		recs[i] = r
		if err := CheckPath(fmt.Sprintf("volumes[%d].path", i), m.Path); err != nil {
			return nil, release, err
		}
		for j, o := range mounts[:i] {
			if o.Path == m.Path || strings.HasPrefix(m.Path, o.Path+"/") || strings.HasPrefix(o.Path, m.Path+"/") {
				return nil, release, errdefs.Invalidf("volumes[%d].path: %q overlaps volumes[%d].path %q", i, m.Path, j, o.Path)
			}
		}
		out = append(out, sandbox.VolumeMount{VolumeMount: m, Source: s.MountPath(r.Storage)})
	}
	s.mu.Lock()
	for i, m := range mounts {
		if s.busy[busyKey(recs[i].Tenant, recs[i].Name)] {
			s.mu.Unlock()
			return nil, release, errdefs.Conflictf("volumes: volume %q is being deleted", m.Name)
		}
	}
	for _, r := range recs {
		s.pending[r.Storage]++
	}
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, r := range recs {
				if s.pending[r.Storage]--; s.pending[r.Storage] <= 0 {
					delete(s.pending, r.Storage)
				}
			}
		})
	}
	// A delete that finished between the look-up above and the count is
	// caught here; one that starts after the count refuses.
	for i, m := range mounts {
		if r, err := s.record(ctx, fmt.Sprintf("volumes[%d].name", i), m.Name); err != nil || r.Storage != recs[i].Storage {
			release()
			if err == nil {
				err = errdefs.NotFoundf("volumes[%d].name: no volume %q", i, m.Name) // deleted and made again
			}
			return nil, func() {}, err
		}
	}
	return out, release, nil
}
