package image

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a small tmpfs at dir (made first) and unmounts it, if
// still there, when the test ends.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// TestReleaseDirWalk releases a sandbox-like directory through the walk
// (no mount table): a mounted disk with files in it, a path mounted twice,
// a bind mount of a file (the pinned user namespace) and of another file
// system's directory. Everything is unmounted and removed, and what is
// inside the bound file system is not touched.
func TestReleaseDirWalk(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	dir := filepath.Join(base, "sandbox")
	disk := filepath.Join(dir, "disk")
	mountTmpfs(t, disk)
	writeFile(t, filepath.Join(disk, "upper", "etc", "written"), "x")
	stacked := filepath.Join(dir, "layers", "rootfs")
	mountTmpfs(t, stacked)
	mountTmpfs(t, stacked)
	writeFile(t, filepath.Join(dir, "agent", "state"), "y")

	pinSrc := filepath.Join(base, "pin-source")
	writeFile(t, pinSrc, "ns")
	pin := filepath.Join(dir, "userns")
	writeFile(t, pin, "")
	if err := unix.Mount(pinSrc, pin, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pin, unix.MNT_DETACH) })

	// Another file system's contents, bound into dir: unmounting must
	// leave them alone (a remove that crossed the mount would empty it).
	other := filepath.Join(base, "other")
	mountTmpfs(t, other)
	writeFile(t, filepath.Join(other, "keep"), "someone else's")
	bound := filepath.Join(dir, "bound")
	if err := os.Mkdir(bound, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(other, bound, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bound, unix.MNT_DETACH) })

	if m := mountsBelow(t, dir); len(m) != 5 {
		t.Fatalf("mounts below %s before: %v, want 5", dir, m)
	}
	if err := releaseMounted(dir); err != nil {
		t.Fatalf("releaseMounted: %v, want the walk to release it all", err)
	}
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(other, "keep")); err != nil {
		t.Fatalf("a file of a file system bound into the dir was removed: %v", err)
	}
	if err := ReleaseDir(dir); err != nil {
		t.Fatalf("second ReleaseDir: %v", err)
	}
}

// TestReleaseDirMountIsTheDir releases a directory that is itself a mount
// point (a sandbox's disk, recorded by its mount path).
func TestReleaseDirMountIsTheDir(t *testing.T) {
	requireRoot(t)
	disk := filepath.Join(t.TempDir(), "disk")
	mountTmpfs(t, disk)
	writeFile(t, filepath.Join(disk, "workspace", "f"), "x")
	if err := releaseMounted(disk); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, disk); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
	if _, err := os.Lstat(disk); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left: %v", disk, err)
	}
}

// TestReleaseDirNestedFallsBack has a mount below a mount: the walk's one
// unmount attempt finds the outer one busy and hands over to the mount
// table, which unmounts deepest first; ReleaseDir still releases it all.
func TestReleaseDirNestedFallsBack(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "sandbox")
	outer := filepath.Join(dir, "disk")
	mountTmpfs(t, outer)
	inner := filepath.Join(outer, "inner")
	mountTmpfs(t, inner)
	writeFile(t, filepath.Join(inner, "f"), "x")

	if err := releaseMounted(dir); !errors.Is(err, errSlowPath) {
		t.Fatalf("releaseMounted of nested mounts: %v, want errSlowPath", err)
	}
	if m := mountsBelow(t, dir); len(m) != 2 {
		t.Fatalf("mounts after the walk gave up: %v, want both still there", m)
	}
	if err := ReleaseDir(dir); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left: %v", dir, err)
	}
}
