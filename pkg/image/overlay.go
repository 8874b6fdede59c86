package image

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/userns"
)

// Layers are the host paths of one sandbox's file systems: the overlay of
// its image (read-only lower) and an upper layer, plus /workspace and /tmp,
// all on one writable file system the caller mounted (pkg/storage: an ext4
// image on a loop device, or a tmpfs), so that its size limit bounds
// everything the sandbox can write and filling it fails with ENOSPC inside
// that sandbox and nowhere else.
type Layers struct {
	// Rootfs is the overlay of the image (lower, read-only) and the
	// sandbox's upper layer. The runtime mounts it read-only as /.
	Rootfs string
	// Workspace is bind-mounted at /workspace.
	Workspace string
	// Tmp is bind-mounted at /tmp.
	Tmp string

	dir string
}

// Names below a layers directory.
const layersRootfs = "rootfs"

// unmountAttempts and unmountBackoff bound how long Release waits for a
// busy mount (a process that has not quite exited) before it detaches it.
const (
	unmountAttempts = 10
	unmountBackoff  = 50 * time.Millisecond
)

// PrepareLayers lays out one sandbox's writable state on disk, a mounted
// and empty writable file system: upper/, work/, workspace/ and tmp/ in it,
// and the overlay of img.Rootfs and upper/ at dir/rootfs. dir must not
// exist yet. The workspace belongs to uid:gid; its input/ and output/ take
// the mode and owner of the image's /workspace/input and /workspace/output.
// On error nothing is left mounted and dir is removed; disk is the
// caller's.
func PrepareLayers(img *Image, dir, disk string, uid, gid int) (*Layers, error) {
	return PrepareMappedLayers(img, dir, disk, uid, gid, nil, nil)
}

// PrepareMappedLayers is PrepareLayers for a sandbox in its own user
// namespace ns with mapping m (nil: none). uid and gid are ids inside the
// sandbox; what is created on disk belongs to their host ids under m, and
// the image is the overlay's lower layer through an idmapped clone
// (pkg/userns), so that its files, owned by 0..n on the host, appear to
// the sandbox owned by 0..n of its namespace while the host sees
// m.HostID+0..n. Copy-up keeps those shifted owners in the upper layer.
// The shared image on disk is never chowned, and the clone is read-only.
func PrepareMappedLayers(img *Image, dir, disk string, uid, gid int, m *userns.IDMap, ns *os.File) (_ *Layers, err error) {
	host := func(id int) int {
		if m == nil {
			return id
		}
		return m.Host(id)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}
	if disk, err = filepath.Abs(disk); err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}
	if err := checkLayerPaths(img, dir, disk); err != nil {
		return nil, err
	}
	l := &Layers{
		Rootfs:    filepath.Join(dir, layersRootfs),
		Workspace: filepath.Join(disk, "workspace"),
		Tmp:       filepath.Join(disk, "tmp"),
		dir:       dir,
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}
	// A fresh directory, never an existing one: the cleanup below removes
	// dir, which must not take another sandbox's layers with it. 0700: only
	// root on the host walks to the mounts below; the runtime bind-mounts
	// them into the container from here.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := ReleaseDir(dir); rerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
			}
		}
	}()
	if m != nil {
		// The sandbox's init (host uid and gid m.HostID) mounts its root
		// from dir/rootfs: its group may walk there (not list); no other
		// host user may.
		if err := os.Chown(dir, 0, host(0)); err != nil {
			return nil, fmt.Errorf("prepare layers: %w", err)
		}
		if err := os.Chmod(dir, 0o710); err != nil {
			return nil, fmt.Errorf("prepare layers: %w", err)
		}
	}
	if err := os.Mkdir(l.Rootfs, 0o700); err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}
	upper, work := filepath.Join(disk, "upper"), filepath.Join(disk, "work")
	if err := makeDiskDirs(img, l, upper, work, uid, gid, host); err != nil {
		return nil, fmt.Errorf("prepare layers: %w", err)
	}

	// nosuid and nodev carry over to the runtime's bind mount of the
	// rootfs: setuid binaries of the image (su, mount, ...) stay inert even
	// if a sandbox process somehow kept the privilege to use them.
	lower := img.Rootfs
	if m != nil {
		if lower, err = mountMappedLower(img.Rootfs, filepath.Join(dir, "lower"), ns); err != nil {
			return nil, fmt.Errorf("prepare layers: %w", err)
		}
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", l.Rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl); err != nil {
		return nil, fmt.Errorf("prepare layers: mount overlay on %s: %w", l.Rootfs, err)
	}
	if m != nil {
		// overlayfs holds a private clone of each layer's mount (idmapping
		// included): the attached clone is no longer needed.
		_ = unix.Unmount(lower, unix.MNT_DETACH)
		_ = os.Remove(lower)
	}
	return l, nil
}

// checkLayerPaths refuses paths an overlay mount cannot carry and an
// image whose root file system is not a directory.
func checkLayerPaths(img *Image, dir, disk string) error {
	// Overlay mount options separate layers with ':' and options with ','.
	for _, p := range []string{img.Rootfs, dir, disk} {
		if strings.ContainsAny(p, ",:\\\n") {
			return fmt.Errorf("prepare layers: path %q contains a character overlayfs options cannot carry", p)
		}
	}
	if fi, err := os.Stat(img.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("prepare layers: image %s rootfs %q: not a directory (%w)", img.Name, img.Rootfs, err)
	}
	return nil
}

// makeDiskDirs makes the overlay's upper and work directories and the
// sandbox's tmp and workspace on its disk, owned by their ids on the host.
// The workspace's input and output keep the image's modes and owners.
func makeDiskDirs(img *Image, l *Layers, upper, work string, uid, gid int, host func(int) int) error {
	for _, d := range []string{upper, work} {
		// The upper dir's owner is the owner of the sandbox's "/".
		if err := makeDir(d, 0o755, host(0), host(0)); err != nil {
			return err
		}
	}
	if err := makeDir(l.Tmp, os.ModePerm|os.ModeSticky, host(0), host(0)); err != nil {
		return err
	}
	if err := makeDir(l.Workspace, 0o755, host(uid), host(gid)); err != nil {
		return err
	}
	for _, sub := range []string{"input", "output"} {
		mode, owner, group := os.FileMode(0o755), uid, gid
		if fi, err := os.Lstat(filepath.Join(img.Rootfs, WorkspaceDir, sub)); err == nil && fi.IsDir() {
			st := fi.Sys().(*syscall.Stat_t)
			mode, owner, group = fi.Mode()&(os.ModePerm|os.ModeSticky|os.ModeSetgid), int(st.Uid), int(st.Gid)
		}
		if err := makeDir(filepath.Join(l.Workspace, sub), mode, host(owner), host(group)); err != nil {
			return err
		}
	}
	return nil
}

// mountMappedLower attaches an idmapped, read-only clone of rootfs at at.
func mountMappedLower(rootfs, at string, ns *os.File) (string, error) {
	if err := os.Mkdir(at, 0o700); err != nil {
		return "", err
	}
	if err := userns.MountIdmapped(rootfs, at, ns); err != nil {
		return "", err
	}
	return at, nil
}

// Release unmounts the layers and removes their directory. It is
// idempotent.
func (l *Layers) Release() error { return ReleaseDir(l.dir) }

// ReleaseDir unmounts whatever is mounted at or below dir, deepest first,
// and removes dir. It is what Release does, for callers
// that only know the directory, such as garbage collection after a crash.
// A directory that does not exist is already released.
func ReleaseDir(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("release layers: %w", err)
	}
	// The walk first; the mount table only when the walk cannot settle it.
	if err := releaseMounted(dir); err == nil {
		return nil
	}
	if err := unmountAll(dir); err != nil {
		return fmt.Errorf("release layers: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("release layers: %w", err)
	}
	return nil
}

// makeDir creates dir with exactly mode and owner, whatever the umask.
func makeDir(dir string, mode os.FileMode, uid, gid int) error {
	if err := os.Mkdir(dir, mode); err != nil {
		return err
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

// unmountAll unmounts every mount at or below dir, deepest first, so that
// dir can then be deleted without reaching into a mounted file system.
func unmountAll(dir string) error {
	// mountinfo lists resolved paths.
	resolved, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(resolved))
	if err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	// Deepest first; a path mounted several times appears once per mount
	// and is unmounted as often.
	slices.SortStableFunc(mounts, func(a, b *mountinfo.Info) int {
		return len(b.Mountpoint) - len(a.Mountpoint)
	})
	var errs []error
	for _, m := range mounts {
		errs = append(errs, unmount(m.Mountpoint))
	}
	return errors.Join(errs...)
}

// unmount unmounts target, retrying while it is busy. Only as a last resort
// is it detached (MNT_DETACH): the file system then lives on, invisible,
// until its last user goes, which is worth a log line.
func unmount(target string) error {
	var err error
	for range unmountAttempts {
		err = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // unmounted, or no longer a mount point
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		time.Sleep(unmountBackoff)
	}
	slog.Warn("detaching busy mount", "path", target, "reason", err.Error())
	if derr := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); derr != nil && !errors.Is(derr, unix.EINVAL) {
		return fmt.Errorf("detach %s: %w", target, derr)
	}
	return nil
}
