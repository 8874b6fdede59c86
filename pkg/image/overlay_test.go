package image

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

// writableDisk mounts a tmpfs of size bytes at a new directory beside dir,
// standing for the file system pkg/storage gives a sandbox.
func writableDisk(t *testing.T, dir string, size int64) string {
	t.Helper()
	disk := dir + "-disk"
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := storage.MountMemory(disk, size, storage.DefaultInodes(size)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ReleaseDir(disk); err != nil {
			t.Error(err)
		}
	})
	return disk
}

func TestPrepareLayersDiskLimit(t *testing.T) {
	requireRoot(t)
	img := ensureCached(t, loadShell(t))
	const disk = 16 << 20
	dir := filepath.Join(t.TempDir(), "sandbox")

	diskDir := writableDisk(t, dir, disk)
	l, err := PrepareLayers(img, dir, diskDir, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	if m := mountsBelow(t, dir); len(m) != 1 {
		t.Fatalf("mounts below %s: %v, want the overlay", dir, m)
	}

	// The overlay shows the image, and writes to it land in the upper layer.
	if _, err := os.Stat(filepath.Join(l.Rootfs, "usr/bin/bash")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Rootfs, "etc/written-in-sandbox"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img.Rootfs, "etc/written-in-sandbox")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a write to the overlay reached the image: %v", err)
	}

	for _, d := range []struct {
		path string
		uid  uint32
		mode os.FileMode
	}{
		{l.Workspace, 1000, 0o755},
		{filepath.Join(l.Workspace, "input"), 1000, 0o755},
		{filepath.Join(l.Workspace, "output"), 1000, 0o755},
		{l.Tmp, 0, os.ModePerm | os.ModeSticky},
	} {
		fi, err := os.Stat(d.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Sys().(*syscall.Stat_t).Uid; got != d.uid || fi.Mode()&(os.ModePerm|os.ModeSticky) != d.mode {
			t.Errorf("%s: uid %d mode %s, want %d %s", d.path, got, fi.Mode(), d.uid, d.mode)
		}
	}

	// Twice the disk size, written from the host, must hit the limit.
	f, err := os.Create(filepath.Join(l.Workspace, "big"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(f, io.LimitReader(zeroReader{}, 2*disk))
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing %d bytes to a %d byte disk: %v, want ENOSPC", 2*disk, disk, err)
	}
	used, _, err := storage.Usage(diskDir)
	if err != nil {
		t.Fatal(err)
	}
	if used < disk-(1<<20) || used > disk {
		t.Errorf("DiskUsage = %d, want about %d", used, disk)
	}
	// The overlay's upper layer shares the limit.
	err = os.WriteFile(filepath.Join(l.Rootfs, "etc/more"), bytes.Repeat([]byte("x"), 1<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writing to the full overlay: %v, want ENOSPC", err)
	}

	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Fatalf("mounts left after Release: %v", m)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left after Release: %v", dir, err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

// TestReleaseDirBusy releases layers whose workspace a process still has
// open, as garbage collection does after a crash: nothing may stay mounted.
func TestReleaseDirBusy(t *testing.T) {
	requireRoot(t)
	img := ensureCached(t, loadShell(t))
	dir := filepath.Join(t.TempDir(), "crashed")
	l, err := PrepareLayers(img, dir, writableDisk(t, dir, 1<<20), 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	busy, err := os.Open(filepath.Join(l.Rootfs, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	if err := ReleaseDir(dir); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Fatalf("mounts left after ReleaseDir: %v", m)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left after ReleaseDir: %v", dir, err)
	}
}

func TestPrepareLayersRefusesExistingDir(t *testing.T) {
	requireRoot(t)
	img := ensureCached(t, loadShell(t))
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	writeFile(t, keep, "other sandbox's data")
	disk := writableDisk(t, filepath.Join(t.TempDir(), "d"), 1<<20)
	if _, err := PrepareLayers(img, dir, disk, 1000, 1000); err == nil {
		t.Fatal("PrepareLayers on an existing directory succeeded")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("failed PrepareLayers removed an existing directory: %v", err)
	}
	if _, err := PrepareLayers(img, filepath.Join(dir, "a,b"), disk, 1000, 1000); err == nil {
		t.Fatal("PrepareLayers accepted a path overlayfs cannot take")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
