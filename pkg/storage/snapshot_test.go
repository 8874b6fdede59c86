package storage_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

func mustWrite(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotRoundTrip archives a workspace, a tmp and an overlay upper
// layer with a whiteout and an opaque directory, and applies it: contents,
// modes, owners, symlinks, fifos and user xattrs come back; the whiteout
// removes its path in the target, the opaque directory hides what was there.
func TestSnapshotRoundTrip(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	ws, tmp, upper := filepath.Join(base, "ws"), filepath.Join(base, "tmp"), filepath.Join(base, "upper")
	mustWrite(t, filepath.Join(ws, "a.txt"), "alpha", 0o640)
	mustWrite(t, filepath.Join(ws, "sub/b.sh"), "#!/bin/sh\n", 0o755)
	if err := os.Chown(filepath.Join(ws, "a.txt"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(ws, "sub/b.sh"), 4242, 4242); err != nil { // a foreign owner
		t.Fatal(err)
	}
	if err := os.Symlink("../a.txt", filepath.Join(ws, "sub/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(ws, "a.txt"), filepath.Join(ws, "sub/hard")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	xattrOK := unix.Setxattr(filepath.Join(ws, "a.txt"), "user.color", []byte("blue"), 0) == nil
	mustWrite(t, filepath.Join(tmp, "t"), "tmpfile", 0o600)
	mustWrite(t, filepath.Join(upper, "etc/new.conf"), "new", 0o644)
	mustWrite(t, filepath.Join(upper, "etc/hosts"), "source's hosts", 0o644)
	if err := unix.Mknod(filepath.Join(upper, "etc/gone"), syscall.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(upper, "opt/opaque"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opt/opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(upper, "opt/opaque/kept"), "k", 0o644)

	snaps := filepath.Join(base, "snapshots")
	secs := map[string]string{storage.SectionUpper: upper, storage.SectionWorkspace: ws, storage.SectionTmp: tmp}
	sf, err := storage.WriteSnapshot(snaps, secs, 0, 0, storage.IDRange{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(sf.Digest) != 64 || sf.Path != filepath.Join(snaps, sf.Digest+storage.SnapshotSuffix) || sf.Size <= 0 {
		t.Fatalf("snapshot file %+v", sf)
	}
	// Content-addressed: the same state gives the same archive.
	again, err := storage.WriteSnapshot(snaps, secs, 0, 0, storage.IDRange{}, 1000)
	if err != nil || again.Digest != sf.Digest {
		t.Fatalf("second snapshot %+v, %v; want digest %s", again, err, sf.Digest)
	}
	if _, err := storage.WriteSnapshot(snaps, secs, 64, 0, storage.IDRange{}, 1000); !errors.Is(err, storage.ErrSnapshotTooLarge) {
		t.Fatalf("64-byte cap: %v, want ErrSnapshotTooLarge", err)
	}
	// A sparse file counts with its apparent size.
	sparse := filepath.Join(ws, "sparse")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 1<<40); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.WriteSnapshot(snaps, secs, 0, 1<<30, storage.IDRange{}, 1000); !errors.Is(err, storage.ErrSnapshotContentTooLarge) {
		t.Fatalf("sparse terabyte under a 1 GiB content cap: %v, want ErrSnapshotContentTooLarge", err)
	}
	if err := os.Remove(sparse); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(snaps, ".partial-*")); len(left) > 0 {
		t.Fatalf("partial archives left: %v", left)
	}

	// Targets: a "merged" root with what the image had, a workspace with
	// junk to be replaced.
	root, ws2, tmp2 := filepath.Join(base, "root"), filepath.Join(base, "ws2"), filepath.Join(base, "tmp2")
	mustWrite(t, filepath.Join(root, "etc/gone"), "lower file", 0o644)
	mustWrite(t, filepath.Join(root, "etc/hosts"), "target's hosts", 0o644)
	mustWrite(t, filepath.Join(root, "opt/opaque/hidden"), "lower", 0o644)
	mustWrite(t, filepath.Join(ws2, "junk"), "junk", 0o644)
	if err := os.MkdirAll(tmp2, 0o1777); err != nil {
		t.Fatal(err)
	}
	err = storage.ApplySnapshot(sf.Path, storage.ApplyTargets{Rootfs: root, SkipRoot: []string{"etc/hosts"},
		Workspace: ws2, Tmp: tmp2, UID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if read(filepath.Join(ws2, "a.txt")) != "alpha" || read(filepath.Join(ws2, "sub/link")) != "alpha" || read(filepath.Join(tmp2, "t")) != "tmpfile" {
		t.Error("contents differ")
	}
	if _, err := os.Stat(filepath.Join(ws2, "junk")); !os.IsNotExist(err) {
		t.Errorf("junk survived the restore: %v", err)
	}
	st := func(p string) *syscall.Stat_t {
		var s syscall.Stat_t
		if err := syscall.Lstat(p, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	if s := st(filepath.Join(ws2, "a.txt")); s.Mode&0o7777 != 0o640 || s.Uid != 1000 {
		t.Errorf("a.txt mode %o uid %d", s.Mode&0o7777, s.Uid)
	}
	if s := st(filepath.Join(ws2, "sub/b.sh")); s.Mode&0o7777 != 0o755 || s.Uid != 1000 {
		t.Errorf("b.sh: mode %o uid %d (foreign owner must become the sandbox's)", s.Mode&0o7777, s.Uid)
	}
	if s := st(filepath.Join(ws2, "fifo")); s.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Errorf("fifo is mode %o", s.Mode)
	}
	if a, h := st(filepath.Join(ws2, "a.txt")), st(filepath.Join(ws2, "sub/hard")); a.Ino != h.Ino || a.Nlink != 2 {
		t.Errorf("hard link not kept: inodes %d %d, nlink %d", a.Ino, h.Ino, a.Nlink)
	}
	if l, err := os.Readlink(filepath.Join(ws2, "sub/link")); err != nil || l != "../a.txt" {
		t.Errorf("symlink %q %v", l, err)
	}
	if xattrOK {
		buf := make([]byte, 16)
		n, err := unix.Getxattr(filepath.Join(ws2, "a.txt"), "user.color", buf)
		if err != nil || string(buf[:n]) != "blue" {
			t.Errorf("user xattr: %q %v", buf[:n], err)
		}
	}
	if read(filepath.Join(root, "etc/new.conf")) != "new" || read(filepath.Join(root, "etc/hosts")) != "target's hosts" {
		t.Error("upper layer not applied (or a skipped path was)")
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !os.IsNotExist(err) {
		t.Errorf("whiteout did not remove etc/gone: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "opt/opaque/hidden")); !os.IsNotExist(err) {
		t.Errorf("opaque dir kept the lower entry: %v", err)
	}
	if read(filepath.Join(root, "opt/opaque/kept")) != "k" {
		t.Error("opaque dir lost its own entry")
	}
}

// hostileArchive writes a snapshot archive holding the given entries.
func hostileArchive(t *testing.T, hdrs ...*tar.Header) string {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size))); err != nil {
				t.Fatal(err)
			}
		}
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(t.TempDir(), "evil.tar.zst")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestApplySnapshotRefusesEscapes feeds crafted archives: nothing is
// written outside the targets, device nodes are not made.
func TestApplySnapshotRefusesEscapes(t *testing.T) {
	testenv.RequireRoot(t)
	outside := t.TempDir()
	cases := map[string][]*tar.Header{
		"dotdot":   {{Name: "workspace/../../evil", Typeflag: tar.TypeReg, Size: 1}},
		"absolute": {{Name: "/workspace/evil", Typeflag: tar.TypeReg, Size: 1}},
		"section":  {{Name: "etc/passwd", Typeflag: tar.TypeReg, Size: 1}},
		"symlink": {
			{Name: "workspace/link", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "workspace/link/evil", Typeflag: tar.TypeReg, Size: 1},
		},
		"device":  {{Name: "workspace/sda", Typeflag: tar.TypeBlock, Devmajor: 8}},
		"chardev": {{Name: "upper/dev/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}},
		"link-out": {
			{Name: "workspace/l", Typeflag: tar.TypeLink, Linkname: "upper/etc/passwd"},
		},
		"link-not-in-archive": {
			{Name: "upper/etc/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "upper/etc/l", Typeflag: tar.TypeLink, Linkname: "upper/etc/shadow"},
		},
		"link-escape": {
			{Name: "workspace/l", Typeflag: tar.TypeLink, Linkname: "workspace/../../etc/passwd"},
		},
		"ws-whiteout": {
			{Name: "workspace/w", Typeflag: tar.TypeChar},
		},
		"too-big": {{Name: "workspace/big", Typeflag: tar.TypeReg, Size: 4096}},
		"user-not-a-number": {
			{Name: "workspace/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{"SANDBOXD.user": "root"}},
			{Name: "workspace/evil", Typeflag: tar.TypeReg, Size: 1},
		},
		"user-out-of-range": {
			{Name: "workspace/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{"SANDBOXD.user": "4294967295"}},
			{Name: "workspace/evil", Typeflag: tar.TypeReg, Size: 1},
		},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			ws, root := filepath.Join(base, "ws"), filepath.Join(base, "root")
			for _, d := range []string{ws, root} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// A file of the target the archive does not have.
			mustWrite(t, filepath.Join(root, "etc/shadow"), "secret", 0o600)
			err := storage.ApplySnapshot(hostileArchive(t, hdrs...), storage.ApplyTargets{Rootfs: root, Workspace: ws, UID: 1000, MaxBytes: 1024})
			if err == nil {
				t.Fatal("applied a hostile archive")
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) > 0 {
				t.Fatalf("wrote outside the target: %v", ents)
			}
			for _, p := range []string{filepath.Join(base, "evil"), "/evil", filepath.Join(ws, "sda"), filepath.Join(root, "dev/mem"),
				filepath.Join(ws, "l"), filepath.Join(root, "etc/l"), filepath.Join(ws, "evil")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s exists", p)
				}
			}
			t.Log(strings.TrimSpace(err.Error()))
		})
	}
}

// TestSnapshotAcrossIDRanges: a sandbox with a user namespace owns its
// files under host ids of its range; the archive holds the sandbox's view
// (1000, 0), and applying it to another range (a fork) or to none gives
// that range's host ids. A host id outside the range is the overflow id
// inside, which a restore turns into the sandbox user.
func TestSnapshotAcrossIDRanges(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	src := storage.IDRange{Base: 0x70000000, Size: 65536}
	ws := filepath.Join(base, "ws")
	for name, owner := range map[string]int{"user.txt": src.Base + 1000, "root.txt": src.Base, "foreign.txt": 4242} {
		mustWrite(t, filepath.Join(ws, name), name, 0o644)
		if err := os.Chown(filepath.Join(ws, name), owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(ws, src.Base+1000, src.Base+1000); err != nil {
		t.Fatal(err)
	}
	sf, err := storage.WriteSnapshot(filepath.Join(base, "snapshots"), map[string]string{storage.SectionWorkspace: ws}, 0, 0, src, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []storage.IDRange{{Base: 0x70010000, Size: 65536}, {}} {
		target := filepath.Join(base, "fork"+strconv.Itoa(dst.Base))
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := storage.ApplySnapshot(sf.Path, storage.ApplyTargets{Workspace: target, UID: 1000, IDs: dst}); err != nil {
			t.Fatal(err)
		}
		host := func(id int) uint32 { return uint32(dst.Base + id) }
		for name, want := range map[string]uint32{"user.txt": host(1000), "root.txt": host(0), "foreign.txt": host(1000)} {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(target, name), &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != want || st.Gid != want {
				t.Errorf("range %+v: %s owned by %d:%d, want %d", dst, name, st.Uid, st.Gid, want)
			}
		}
	}
}

// TestSnapshotUserChangesHands: the files of the user of the sandbox that
// took the snapshot become the restoring sandbox's user's in /workspace and
// /tmp, also when that user was root (a root-mode sandbox forked to an
// unprivileged one); root's files of the root file system stay root's; the
// sections' own directories keep the target's owners.
func TestSnapshotUserChangesHands(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	src := storage.IDRange{Base: 0x70000000, Size: 65536}
	ws, tmp, upper := filepath.Join(base, "ws"), filepath.Join(base, "tmp"), filepath.Join(base, "upper")
	files := map[string]int{
		filepath.Join(ws, "by-root.txt"): 0, filepath.Join(ws, "dir/nested.txt"): 0, filepath.Join(ws, "by-user.txt"): 1000,
		filepath.Join(tmp, "by-root.txt"): 0, filepath.Join(upper, "etc/by-root.conf"): 0,
	}
	for p, owner := range files {
		mustWrite(t, p, filepath.Base(p), 0o644)
		if err := os.Chown(p, src.Base+owner, src.Base+owner); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{ws, filepath.Join(ws, "dir"), tmp, upper, filepath.Join(upper, "etc")} {
		if err := os.Chown(d, src.Base, src.Base); err != nil {
			t.Fatal(err)
		}
	}
	secs := map[string]string{storage.SectionUpper: upper, storage.SectionWorkspace: ws, storage.SectionTmp: tmp}
	// A root-mode sandbox: its user is 0.
	sf, err := storage.WriteSnapshot(filepath.Join(base, "snapshots"), secs, 0, 0, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	dst := storage.IDRange{Base: 0x70010000, Size: 65536}
	host := func(id int) uint32 { return uint32(dst.Base + id) }
	for _, tc := range []struct {
		name      string
		uid       int
		user      uint32 // what root's and the user's files of /workspace and /tmp become
		wsOwner   uint32 // the target's /workspace, kept
		tmpOwner  uint32 // the target's /tmp, kept
		upperRoot uint32 // root's file of the root file system
	}{
		{"unprivileged fork", 1000, host(1000), host(1000), host(0), host(0)},
		{"root-mode fork", 0, host(0), host(0), host(0), host(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := filepath.Join(base, strconv.Itoa(tc.uid))
			tws, ttmp, troot := filepath.Join(tb, "ws"), filepath.Join(tb, "tmp"), filepath.Join(tb, "root")
			for d, owner := range map[string]uint32{tws: tc.wsOwner, ttmp: tc.tmpOwner, troot: host(0)} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(d, int(owner), int(owner)); err != nil {
					t.Fatal(err)
				}
			}
			if err := storage.ApplySnapshot(sf.Path, storage.ApplyTargets{Rootfs: troot, Workspace: tws, Tmp: ttmp, UID: tc.uid, IDs: dst}); err != nil {
				t.Fatal(err)
			}
			want := map[string]uint32{
				tws: tc.wsOwner, ttmp: tc.tmpOwner,
				filepath.Join(tws, "by-root.txt"): tc.user, filepath.Join(tws, "dir"): tc.user, filepath.Join(tws, "dir/nested.txt"): tc.user,
				filepath.Join(tws, "by-user.txt"): host(tc.uid), filepath.Join(ttmp, "by-root.txt"): tc.user,
				filepath.Join(troot, "etc/by-root.conf"): tc.upperRoot, filepath.Join(troot, "etc"): tc.upperRoot,
			}
			for p, w := range want {
				var st unix.Stat_t
				if err := unix.Lstat(p, &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid != w || st.Gid != w {
					t.Errorf("%s owned by %d:%d, want %d", p, st.Uid, st.Gid, w)
				}
			}
		})
	}
}
