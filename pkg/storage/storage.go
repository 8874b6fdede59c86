// Package storage gives each sandbox the file system that holds everything
// it can write (the rootfs overlay's upper and work dirs, /workspace, /tmp),
// with a hard size limit and an inode limit, in one of two backings:
//
//   - disk: a sparse ext4 image file per sandbox (paths.sandboxes_dir/<id>.img)
//     on a loop device, mounted by the daemon. Filling it fails with ENOSPC
//     inside the sandbox; its pages are ordinary page cache (reclaimable), not
//     shmem, so a sandbox can write far more than its memory limit.
//   - memory: a tmpfs of the same size and inode count; fastest, but every
//     byte written is shmem charged to the sandbox's memory cgroup.
//
// An image is a copy of a pre-formatted template, one per (size, inodes),
// made once by mkfs.ext4 and then copied sparsely (FICLONE where the file
// system can share extents, else only the template's data extents): a copy is
// a few hundred KiB of metadata, an order of magnitude faster than running
// mkfs.ext4 per sandbox (docs/storage.md "Template vs mkfs, measured" has
// the figures).
//
// Loop devices are attached with LO_FLAGS_AUTOCLEAR: the kernel detaches the
// device when its last opener goes, which is the mount once the daemon has
// closed its descriptor. A daemon killed between attaching and mounting
// therefore leaves no device behind (its descriptor dies with it), and
// unmounting the file system frees the device. The ledger still records the
// device, and Detach clears any device still backed by a sandbox's image.
//
// Security: the image's file system is mounted nosuid,nodev by the daemon in
// the host's mount namespace, under run_dir (root-only); sandboxes only see
// bind mounts of directories in it. A sandbox can write arbitrary bytes into
// its file system but never reaches the block device or the image file, so
// it cannot present a crafted ext4 image to the host kernel's mount code:
// the file system is made and mounted before any sandbox process exists and
// never mounted again.
package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// Backings of a sandbox's writable file system.
const (
	BackingDisk   = "disk"
	BackingMemory = "memory"
)

// ValidBacking reports whether b names a backing.
func ValidBacking(b string) bool { return b == BackingDisk || b == BackingMemory }

// BytesPerInode is the default inode density: one inode per 16 KiB of disk,
// mkfs.ext4's own default, so a 1 GiB sandbox gets 65,536 inodes. Inodes
// are bounded separately from the size because empty files take no blocks.
const BytesPerInode = 16 << 10

// MinInodes is the least inode count a sandbox's file system gets.
const MinInodes = 4096

// DefaultInodes is the inode limit of a file system of diskBytes.
func DefaultInodes(diskBytes int64) int64 { return max(diskBytes/BytesPerInode, MinInodes) }

// imageSuffix ends the name of every sandbox image file.
const imageSuffix = ".img"

// Store makes and removes the image files of disk-backed sandboxes in one
// directory.
type Store struct {
	dir  string
	mkfs string

	// Unlinking an image takes milliseconds to tens of them on a busy host
	// (the host file system frees its extents in its journal): Discard
	// renames it into trash/ and a worker unlinks it after.
	trash     chan struct{}
	trashDone chan struct{}
	closeOnce sync.Once

	templates singleflight.Group
	mu        sync.Mutex // guards made
	made      map[string]bool
}

// NewStore returns the image store in dir (created, 0700). It fails when
// mkfs.ext4 cannot be found: disk-backed sandboxes need it for their
// templates.
func NewStore(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o700); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if _, serr := os.Stat(p); serr == nil {
				mkfs, err = p, nil
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("storage: mkfs.ext4 (e2fsprogs) not found: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "trash"), 0o700); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	s := &Store{dir: dir, mkfs: mkfs, made: map[string]bool{}, trash: make(chan struct{}, 1), trashDone: make(chan struct{})}
	go s.emptyTrash()
	s.trash <- struct{}{} // what an earlier daemon left
	return s, nil
}

// Discard removes an image file: it leaves the store at once (renamed into
// trash/) and is unlinked in the background. A missing one is already
// removed.
func (s *Store) Discard(path string) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	err := os.Rename(path, filepath.Join(s.dir, "trash", filepath.Base(path)+"."+hex.EncodeToString(b[:])))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not in this store's file system, say: unlink it here.
		return RemoveImage(path)
	}
	select {
	case s.trash <- struct{}{}:
	default: // a run is pending and will see it
	}
	return nil
}

func (s *Store) emptyTrash() {
	defer close(s.trashDone)
	dir := filepath.Join(s.dir, "trash")
	for range s.trash {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Close waits until the trash is empty.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		select {
		case s.trash <- struct{}{}:
		default:
		}
		close(s.trash)
		<-s.trashDone
	})
}

// Dir is the directory of the image files.
func (s *Store) Dir() string { return s.dir }

// ImagePath is where the image of sandbox id lives.
func (s *Store) ImagePath(id string) string { return filepath.Join(s.dir, id+imageSuffix) }

// Images lists the image files in the store by sandbox id.
func (s *Store) Images() (map[string]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("storage: list images: %w", err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), imageSuffix); ok && e.Type().IsRegular() {
			out[id] = filepath.Join(s.dir, e.Name())
		}
	}
	return out, nil
}

// CreateImage makes path a fresh ext4 image of size bytes and inodes inodes,
// as a sparse copy of the template for that geometry (made on first use).
// path must not exist. On error nothing is left at path.
func (s *Store) CreateImage(ctx context.Context, path string, size, inodes int64) (err error) {
	return s.createImage(ctx, path, size, inodes, false)
}

// CreateJournaledImage is CreateImage for data that outlives every sandbox
// (named volumes): the ext4 keeps a journal, so that a host crash leaves a
// file system that recovers on its next mount rather than one that needs
// fsck. A sandbox's own disk has no journal: nothing of it survives a host
// crash anyway.
func (s *Store) CreateJournaledImage(ctx context.Context, path string, size, inodes int64) error {
	return s.createImage(ctx, path, size, inodes, true)
}

func (s *Store) createImage(ctx context.Context, path string, size, inodes int64, journal bool) (err error) {
	tmpl, err := s.template(ctx, size, inodes, journal)
	if err != nil {
		return err
	}
	if err := copySparse(tmpl, path); err != nil {
		return fmt.Errorf("storage: copy template to %s: %w", path, err)
	}
	return nil
}

// RemoveImage removes an image file; a missing one is already removed.
func RemoveImage(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("storage: remove image: %w", err)
	}
	return nil
}

// template returns the path of the pre-formatted image of this geometry,
// formatting it first if needed. Concurrent callers share one mkfs.
func (s *Store) template(ctx context.Context, size, inodes int64, journal bool) (string, error) {
	kind := "ext4"
	if journal {
		kind = "ext4j"
	}
	name := fmt.Sprintf("%s-%d-%d%s", kind, size, inodes, imageSuffix)
	path := filepath.Join(s.dir, "templates", name)
	s.mu.Lock()
	made := s.made[name]
	s.mu.Unlock()
	if made {
		return path, nil
	}
	_, err, _ := s.templates.Do(name, func() (any, error) {
		if fi, err := os.Stat(path); err == nil && fi.Size() == size {
			return nil, nil // made by an earlier daemon
		}
		tmp := path + ".tmp" + strconv.Itoa(os.Getpid())
		defer os.Remove(tmp)
		if err := formatImage(ctx, s.mkfs, tmp, size, inodes, journal); err != nil {
			return nil, err
		}
		return nil, os.Rename(tmp, path)
	})
	if err != nil {
		return "", fmt.Errorf("storage: template %s: %w", name, err)
	}
	s.mu.Lock()
	s.made[name] = true
	s.mu.Unlock()
	return path, nil
}

// formatImage makes path a sparse file of size bytes holding an empty ext4.
//
// No journal unless asked (volumes): a sandbox's file system never outlives a host crash in a
// useful way (a rebooted host has lost the sandbox's processes, and
// reconciliation releases it), so the journal would only cost writes. No
// reserved blocks: the whole size is the sandbox's. Lazy inode tables and
// no discard keep the image sparse and mkfs fast; the kernel is told not to
// zero the tables in the background (noinit_itable at mount).
func formatImage(ctx context.Context, mkfs, path string, size, inodes int64, journal bool) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	terr := f.Truncate(size)
	if cerr := f.Close(); terr == nil {
		terr = cerr
	}
	if terr != nil {
		return terr
	}
	features, ext, label := "^has_journal", "lazy_itable_init=1,nodiscard", "sandbox"
	if journal {
		// lazy_journal_init: the journal is not zeroed, so the image stays
		// sparse (the kernel ignores stale journal blocks by sequence).
		features, ext, label = "has_journal", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "volume"
	}
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4",
		"-O", features, "-m", "0", "-N", strconv.FormatInt(inodes, 10),
		"-E", ext, "-L", label, path)
	cmd.SysProcAttr = lifetime.DieWithParent()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copySparse copies src to a new file dst: FICLONE where the file system
// shares extents (btrfs, xfs), else the data extents only, found with
// SEEK_DATA/SEEK_HOLE and copied with copy_file_range.
func copySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(hole-pos), 0)
			if err != nil {
				return fmt.Errorf("copy_file_range: %w", err)
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// attachMu serialises this process's loop attachments (see Attach).
var attachMu sync.Mutex

// attachAttempts bounds Attach's retries when other processes take the
// free device first; with the back-off they span about 0.4 s.
const attachAttempts = 64

// Attach attaches image to a free loop device with LO_FLAGS_AUTOCLEAR and
// returns the device's path and an open descriptor of it. The device stays
// attached while the descriptor or a mount of it is open: the caller mounts
// it and then closes the descriptor.
func Attach(image string) (dev string, f *os.File, err error) {
	backing, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("storage: open image: %w", err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("storage: %w", err)
	}
	defer ctl.Close()
	// GET_FREE only names a device; whoever configures it first gets it.
	// Callers in this process take turns (else a burst of creates all race
	// for the same number and the last waits for every other), and another
	// process (losetup, a second daemon, a test) can still win between the
	// two calls (EBUSY): ask again, backing off a little, as losetup does.
	attachMu.Lock()
	defer attachMu.Unlock()
	for attempt := range attachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("storage: LOOP_CTL_GET_FREE: %w", err)
		}
		dev = "/dev/loop" + strconv.Itoa(n)
		f, err := openLoop(dev, n)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			f.Close()
			time.Sleep(time.Duration(attempt+1) * 200 * time.Microsecond)
			continue
		}
		if err != nil {
			f.Close()
			return "", nil, fmt.Errorf("storage: LOOP_CONFIGURE %s: %w", dev, err)
		}
		rememberAttached(image, dev)
		return dev, f, nil
	}
	return "", nil, fmt.Errorf("storage: no free loop device after %d attempts (other processes keep taking them)", attachAttempts)
}

// openLoop opens loop device n, making its node when devtmpfs has not (yet).
func openLoop(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		if merr := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); merr != nil && !errors.Is(merr, unix.EEXIST) {
			return nil, fmt.Errorf("storage: make %s: %w", dev, merr)
		}
		f, err = os.OpenFile(dev, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return f, nil
}

// attached remembers, per image path, the loop devices this process
// attached to it (Attach; renamed with the image by Pool.Take), so that
// Detach reads those devices' backing files instead of every loop device's:
// a scan reads one sysfs file per device on the host, which made each
// terminate cost O(live sandboxes) (terminates per second fell from 162 at
// 50 live to 39 at 200). An image this process did not attach — one of an
// earlier daemon, found by reconciliation after a crash — is scanned.
var attached = struct {
	sync.Mutex
	m map[string][]string
}{m: map[string][]string{}}

func rememberAttached(image, dev string) {
	attached.Lock()
	defer attached.Unlock()
	attached.m[image] = append(attached.m[image], dev)
}

// renameAttached follows a rename of an attached image (Pool.Take).
func renameAttached(from, to string) {
	attached.Lock()
	defer attached.Unlock()
	if devs, ok := attached.m[from]; ok {
		delete(attached.m, from)
		attached.m[to] = append(attached.m[to], devs...)
	}
}

// takeAttached returns and forgets the devices this process attached to
// image.
func takeAttached(image string) ([]string, bool) {
	attached.Lock()
	defer attached.Unlock()
	devs, ok := attached.m[image]
	delete(attached.m, image)
	return devs, ok
}

// loopBacking reads the backing file of loop device dev ("" when the
// device is free or gone).
func loopBacking(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
}

// detachWait bounds how long Detach waits for a device to be freed: the
// last reference to an unmounted file system can be dropped a little after
// the unmount returns (the killed sandbox's mount namespace goes away with
// its last exiting process).
const detachWait = 5 * time.Second

// Detach clears every loop device whose backing file is image (a device
// that autoclear has not freed yet, or one attached without it) and waits
// until the kernel has freed it. None is success; a device still in use
// after detachWait is an error, so that the ledger keeps it for garbage
// collection to retry.
func Detach(image string) error {
	deadline := time.Now().Add(detachWait)
	cleared := map[string]bool{}
	known, isKnown := takeAttached(image)
	for {
		var devs map[string]string
		if isKnown {
			// Every device this process gave the image; no other process
			// attaches our images.
			devs = map[string]string{}
			for _, d := range known {
				devs[d] = loopBacking(d)
			}
		} else {
			var err error
			if devs, err = LoopDevices(); err != nil {
				return err
			}
		}
		var left []string
		for dev, backing := range devs {
			if backing != image {
				continue
			}
			left = append(left, dev)
			if !cleared[dev] {
				if err := clearLoop(dev); err != nil {
					return err
				}
				cleared[dev] = true
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("storage: loop device %s of %s still in use after %s", strings.Join(left, ", "), image, detachWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func clearLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	defer f.Close()
	// A device still mounted is only marked autoclear by LOOP_CLR_FD; the
	// unmount then frees it. ENXIO: not attached any more.
	for range 10 {
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		if err == nil || errors.Is(err, unix.ENXIO) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("storage: LOOP_CLR_FD %s: %w", dev, err)
}

// LoopDevices lists attached loop devices and their backing files, from
// sysfs. A backing file removed since is listed by its old path.
func LoopDevices() (map[string]string, error) {
	matches, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue // detached meanwhile
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(m)))
		out["/dev/"+name] = strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	}
	return out, nil
}

// Mount options of a sandbox's ext4: no setuid or device files, no atime
// writes, no background zeroing of inode tables, and errors remount the file
// system read-only instead of panicking the host.
const ext4Options = "noinit_itable,errors=remount-ro"

// scratchOptions are ext4Options for a file system whose content ends with
// its sandbox: nobarrier, so that neither the file system nor its overlay
// asks the loop device to flush, which the loop device turns into an fsync
// of the image file on the host's disk. A terminate paid that flush twice,
// in the overlay's unmount (overlayfs syncs its upper file system) and in
// the disk's own (1.7 and 1.1 ms of a 5.2 ms terminate; a probe: 2.1 and
// 2.7 ms with barriers, 0.4 and 0.7 without), and a sandbox's fsync paid
// it too. Nothing is lost that was kept: the image is deleted at
// terminate, and a host crash, the only thing a flush guards against,
// ends the sandbox anyway (the reason it has no journal, formatImage).
// Volumes outlive sandboxes and keep their barriers (MountDisk).
const scratchOptions = ext4Options + ",nobarrier"

// MountDisk mounts the ext4 on dev at target (a directory), durable: a
// flush inside reaches the host's disk (volumes).
func MountDisk(dev, target string) error {
	return mountExt4(dev, target, ext4Options)
}

// MountScratch mounts a sandbox's own ext4 on dev at target: as MountDisk,
// without flushes (scratchOptions says why).
func MountScratch(dev, target string) error {
	return mountExt4(dev, target, scratchOptions)
}

func mountExt4(dev, target, opts string) error {
	if err := unix.Mount(dev, target, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, opts); err != nil {
		return fmt.Errorf("storage: mount %s on %s: %w", dev, target, err)
	}
	return nil
}

// MountMemory mounts a tmpfs of size bytes and inodes inodes at target.
func MountMemory(target string, size, inodes int64) error {
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", size, inodes)
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("storage: mount tmpfs on %s: %w", target, err)
	}
	return nil
}

// Usage returns the bytes and inodes used on the file system mounted at
// target, which must be a sandbox's ext4 or tmpfs.
func Usage(target string) (bytes, inodes int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return 0, 0, fmt.Errorf("disk usage: %w", err)
	}
	// Unmounted, target would report the usage of the host's file system.
	if st.Type != unix.TMPFS_MAGIC && st.Type != unix.EXT4_SUPER_MAGIC {
		return 0, 0, fmt.Errorf("disk usage: %s is not a sandbox file system", target)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Files - st.Ffree), nil
}
