package storage_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

func newStore(t *testing.T) *storage.Store {
	t.Helper()
	s, err := storage.NewStore(filepath.Join(t.TempDir(), "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// attached reports whether some loop device is backed by image.
func attached(t *testing.T, image string) bool {
	t.Helper()
	devs, err := storage.LoopDevices()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range devs {
		if b == image {
			return true
		}
	}
	return false
}

// mountDisk makes, attaches and mounts a disk image of size and inodes as a
// volume is (storage.MountDisk), and cleans up after the test the way the
// container backend's releasers do.
func mountDisk(t *testing.T, s *storage.Store, name string, size, inodes int64) (img, target string) {
	t.Helper()
	return mountImage(t, s, name, size, inodes, storage.MountDisk)
}

// mountImage is mountDisk with the mount function given (storage.MountDisk
// or storage.MountScratch).
func mountImage(t *testing.T, s *storage.Store, name string, size, inodes int64, mount func(dev, target string) error) (img, target string) {
	t.Helper()
	img = s.ImagePath(name)
	target = filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateImage(context.Background(), img, size, inodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(target, 0)
		if err := storage.Detach(img); err != nil {
			t.Error(err)
		}
		if err := storage.RemoveImage(img); err != nil {
			t.Error(err)
		}
	})
	dev, f, err := storage.Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := mount(dev, target); err != nil {
		t.Fatal(err)
	}
	return img, target
}

func fill(path string, n int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i) // not zeros: nothing may be elided
	}
	var done int64
	for done < n {
		w, err := f.Write(buf[:min(int64(len(buf)), n-done)])
		done += int64(w)
		if err != nil {
			return done, err
		}
	}
	return done, f.Sync()
}

// TestDiskLimits: the image is sparse, a write past its size fails with
// ENOSPC, so does creating files past the inode limit, and the host's file
// system holds no more than the bytes written.
func TestDiskLimits(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	const size, inodes = 64 << 20, 4096
	img, target := mountDisk(t, s, "sb-limits", size, inodes)

	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 > 4<<20 {
		t.Fatalf("image %s: size %d, %d bytes allocated; want %d, sparse", img, st.Size, st.Blocks*512, size)
	}
	if !attached(t, img) {
		t.Fatalf("no loop device backed by %s while mounted", img)
	}

	n, err := fill(filepath.Join(target, "big"), 2*size)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing %d bytes to a %d byte disk: wrote %d, %v; want ENOSPC", 2*size, size, n, err)
	}
	used, _, err := storage.Usage(target)
	if err != nil {
		t.Fatal(err)
	}
	// ext4's own metadata (inode tables, bitmaps) takes a few MiB.
	if n < size-8<<20 || used > size {
		t.Errorf("wrote %d bytes, %d used, on a %d byte disk", n, used, size)
	}
	if err := os.Remove(filepath.Join(target, "big")); err != nil {
		t.Fatal(err)
	}

	var created int
	for ; created < 2*inodes; created++ {
		f, err := os.Create(filepath.Join(target, fmt.Sprint(created)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("file %d: %v, want ENOSPC", created, err)
			}
			break
		}
		f.Close()
	}
	if created >= inodes || created < inodes-32 {
		t.Fatalf("created %d files with an inode limit of %d", created, inodes)
	}
	_, usedInodes, err := storage.Usage(target)
	if err != nil {
		t.Fatal(err)
	}
	if usedInodes < inodes-32 || usedInodes > inodes {
		t.Errorf("storage.Usage: %d inodes used, want about %d", usedInodes, inodes)
	}
}

// TestAutoclear: a device whose opener goes away without mounting it (a
// daemon killed between attach and mount) detaches itself, and so does a
// mounted one when it is unmounted.
func TestAutoclear(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := s.ImagePath("sb-autoclear")
	if err := s.CreateImage(context.Background(), img, 32<<20, storage.MinInodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = storage.Detach(img); _ = storage.RemoveImage(img) })
	_, f, err := storage.Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	if !attached(t, img) {
		t.Fatal("not attached after storage.Attach")
	}
	f.Close()
	waitDetached(t, img)

	dev, f, err := storage.Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if err := storage.MountDisk(dev, target); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	if !attached(t, img) {
		t.Fatal("mounted device detached when its descriptor was closed")
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	waitDetached(t, img)
}

// superOptions are the file system options the kernel shows for the
// mount at target.
func superOptions(t *testing.T, target string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 {
		t.Fatalf("%d mounts at %s, want 1", len(ms), target)
	}
	return strings.Split(ms[0].VFSOptions, ",")
}

// TestScratchWithoutBarriers: a sandbox's disk (MountScratch) is mounted
// nobarrier, so its unmount and its overlay's do not flush the image file
// to the host's disk; a volume's (MountDisk) keeps its barriers. Both keep
// the options every disk has.
func TestScratchWithoutBarriers(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	_, durable := mountDisk(t, s, "vol-durable", 32<<20, storage.MinInodes)
	_, target := mountImage(t, s, "sb-scratch", 32<<20, storage.MinInodes, storage.MountScratch)
	for _, c := range []struct {
		target string
		want   bool
	}{{target, true}, {durable, false}} {
		o := superOptions(t, c.target)
		if got := slices.Contains(o, "nobarrier"); got != c.want {
			t.Errorf("%s: options %v, nobarrier %v, want %v", c.target, o, got, c.want)
		}
		if !slices.Contains(o, "errors=remount-ro") {
			t.Errorf("%s: options %v, want errors=remount-ro", c.target, o)
		}
	}
	// A flush inside still succeeds (it goes no further than the image
	// file's page cache).
	if n, err := fill(filepath.Join(target, "f"), 1<<20); err != nil || n != 1<<20 {
		t.Fatalf("write and fsync 1 MiB on the scratch disk: %d, %v", n, err)
	}
}

// TestDetach clears a device that is attached but not mounted, as the
// ledger's loop releaser does, and returns once the kernel has freed it.
func TestDetach(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := s.ImagePath("sb-detach")
	if err := s.CreateImage(context.Background(), img, 32<<20, storage.MinInodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = storage.RemoveImage(img) })
	_, f, err := storage.Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	// Detach clears the device and waits until its last opener is gone.
	go func() { time.Sleep(100 * time.Millisecond); f.Close() }()
	if err := storage.Detach(img); err != nil {
		t.Fatal(err)
	}
	if attached(t, img) {
		t.Fatal("Detach returned with the device still attached")
	}
	if err := storage.Detach(img); err != nil {
		t.Fatalf("storage.Detach of a detached image: %v", err)
	}
}

// TestDetachOfAnotherProcess: a device this process did not attach (an
// earlier daemon's, found by reconciliation after a crash; here losetup's)
// is found by scanning every device, not missed because Detach knows the
// devices it attached itself.
func TestDetachOfAnotherProcess(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := s.ImagePath("sb-detach-other")
	if err := s.CreateImage(context.Background(), img, 32<<20, storage.MinInodes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = storage.Detach(img); _ = storage.RemoveImage(img) })
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v\n%s", err, out)
	}
	if !attached(t, img) {
		t.Fatalf("losetup attached %s, but no device names it", strings.TrimSpace(string(out)))
	}
	if err := storage.Detach(img); err != nil {
		t.Fatal(err)
	}
	if attached(t, img) {
		t.Fatalf("Detach left %s attached to %s", strings.TrimSpace(string(out)), img)
	}
}

func waitDetached(t *testing.T, img string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); attached(t, img); {
		if time.Now().After(deadline) {
			t.Fatalf("%s still attached", img)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentCreate: sandboxes starting at once share one template and
// each get their own device and file system.
func TestConcurrentCreate(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	const n = 6
	var wg sync.WaitGroup
	targets := make([]string, n)
	for i := range n {
		targets[i] = filepath.Join(t.TempDir(), "disk")
		if err := os.Mkdir(targets[i], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img := s.ImagePath(fmt.Sprintf("sb-c%d", i))
			t.Cleanup(func() { _ = unix.Unmount(targets[i], 0); _ = storage.Detach(img); _ = storage.RemoveImage(img) })
			if errs[i] = s.CreateImage(context.Background(), img, 32<<20, storage.MinInodes); errs[i] != nil {
				return
			}
			dev, f, err := storage.Attach(img)
			if err != nil {
				errs[i] = err
				return
			}
			defer f.Close()
			errs[i] = storage.MountDisk(dev, targets[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
		if err := os.WriteFile(filepath.Join(targets[i], "who"), []byte(fmt.Sprint(i)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		b, err := os.ReadFile(filepath.Join(targets[i], "who"))
		if err != nil || string(b) != fmt.Sprint(i) {
			t.Fatalf("disk %d holds %q (%v)", i, b, err)
		}
		if m, _ := mountinfo.Mounted(targets[i]); !m {
			t.Fatalf("%s not mounted", targets[i])
		}
	}
	tmpls, _ := filepath.Glob(filepath.Join(s.Dir(), "templates", "*"))
	if len(tmpls) != 1 {
		t.Fatalf("templates: %v, want one", tmpls)
	}
}

// TestPool: a ready disk moves to a sandbox's mount and image name without
// losing its device, the pool refills, and a new pool releases what an
// abandoned one (a crashed daemon's) left.
func TestPool(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	log := testenv.Logger(t)
	p, err := s.NewPool(32<<20, storage.MinInodes, 2, log)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Matches(32<<20, storage.MinInodes) || p.Matches(64<<20, storage.MinInodes) {
		t.Fatal("Matches")
	}
	p.Fill()
	img := s.ImagePath("sb-pooled")
	target := filepath.Join(t.TempDir(), "disk")
	var from string
	for deadline := time.Now().Add(10 * time.Second); from == ""; {
		if from, err = p.Take(img); err != nil {
			t.Fatal(err)
		}
		if from == "" && time.Now().After(deadline) {
			t.Fatal("no ready disk after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Mount(from, target); err != nil {
		t.Fatal(err)
	}
	if !attached(t, img) {
		t.Fatalf("taken disk: no loop device backed by %s", img)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A pooled disk is a sandbox's: mounted without barriers.
	if o := superOptions(t, target); !slices.Contains(o, "nobarrier") {
		t.Errorf("taken disk mounted with %v, want nobarrier", o)
	}
	if m, _ := mountinfo.Mounted(from); m {
		t.Errorf("pool mount %s still there", from)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := storage.Detach(img); err != nil {
		t.Fatal(err)
	}
	if err := storage.RemoveImage(img); err != nil {
		t.Fatal(err)
	}

	// Abandon p with ready disks, as a killed daemon would.
	time.Sleep(500 * time.Millisecond)
	p2, err := s.NewPool(32<<20, storage.MinInodes, 0, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	devs, _ := storage.LoopDevices()
	for dev, b := range devs {
		if strings.HasPrefix(b, s.Dir()+"/") {
			t.Errorf("loop device %s of %s left", dev, b)
		}
	}
	if m := testenv.MountsUnder(s.Dir()); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	// p's filler may still be making a disk: closing it releases that too.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
