package storage

// Workspace snapshots: a sandbox's writable state (the rootfs overlay's
// upper layer, /workspace and /tmp) as one zstd-compressed tar, named by
// the sha256 of its compressed bytes.
//
// Archive layout: entries below "upper/", "workspace/" and "tmp/", in
// lexical walk order, with modes, owners, mtimes, symlinks and user.*
// extended attributes (PAX SCHILY.xattr). The overlay's own markers are kept
// as overlayfs writes them: a whiteout is a character device 0:0, an opaque
// directory carries trusted.overlay.opaque=y. Hard links within a section
// are kept (a tar link entry naming the first path of the file).
//
// Security boundary: a snapshot's content is sandbox-controlled (names,
// symlinks, modes, xattrs are whatever a sandbox process made), so Apply
// treats it as hostile:
//   - every path is resolved inside its target directory through os.Root,
//     which refuses ".." and symlinks (also ones created earlier by the
//     same archive) that lead outside it;
//   - only directories, regular files, hard links (to an earlier file of the
//     same section), symlinks and fifos are created; a
//     device node is refused, except the 0:0 whiteout of the upper layer,
//     which is turned into a removal (never created);
//   - owners are kept only when they are root or the sandbox's user, anything
//     else becomes the sandbox's user; in /workspace and /tmp the user of the
//     sandbox that took the snapshot (recorded on each section's own entry,
//     userPAXKey) becomes the new sandbox's user, so that a root-mode
//     sandbox's files (uid 0) are its fork's user's, not read-only to it; a
//     section's own directory keeps the owner the new sandbox's layout gave
//     it (/workspace its user's, /tmp root's); setuid/setgid bits of files
//     are dropped (the mounts are nosuid anyway);
//   - only user.* xattrs are restored, through the opened file's descriptor;
//   - the bytes written are bounded by the sandbox's own file system (a full
//     disk is ENOSPC) and by the caller's maxBytes.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Archive sections: each is one directory of a sandbox's writable state.
const (
	SectionUpper     = "upper"
	SectionWorkspace = "workspace"
	SectionTmp       = "tmp"
)

// snapshotSections in archive order.
var snapshotSections = []string{SectionUpper, SectionWorkspace, SectionTmp}

// SnapshotSuffix ends the file name of every snapshot archive.
const SnapshotSuffix = ".tar.zst"

const (
	xattrPAXPrefix = "SCHILY.xattr."
	opaqueXattr    = "trusted.overlay.opaque"
	// userPAXKey, on a section's own directory entry, is the user (the
	// sandbox's view of its uid) of the sandbox that took the snapshot.
	// Without it (archives of earlier versions) nobody's files change hands.
	userPAXKey = "SANDBOXD.user"
)

// ErrSnapshotTooLarge is returned by WriteSnapshot when the archive
// outgrows its cap.
var ErrSnapshotTooLarge = errors.New("snapshot exceeds its size cap")

// ErrSnapshotContentTooLarge is returned by WriteSnapshot when the files
// add up to more than its maxContent.
var ErrSnapshotContentTooLarge = errors.New("snapshot's files exceed their cap")

// SnapshotFile is an archive written by WriteSnapshot.
type SnapshotFile struct {
	Digest string // hex sha256 of the compressed archive: the snapshot's id
	Path   string // dir/<digest>.tar.zst
	Size   int64  // compressed bytes
	// ContentBytes is the sum of the regular files' sizes, what restoring
	// it needs on a sandbox's disk at least.
	ContentBytes int64
	Entries      int

	maxContent int64
	links      map[[2]uint64]string // (dev, inode) of files with several links → first name
}

// WriteSnapshot archives the directories of sections (section name → host
// directory; SectionUpper, SectionWorkspace, SectionTmp) into
// dir/<sha256>.tar.zst and returns it. If an archive with that digest exists
// already it is kept (same bytes). maxBytes > 0 caps the compressed size,
// maxContent > 0 the sum of the files' sizes (ErrSnapshotContentTooLarge):
// a sparse file counts with its apparent size, as it is archived (and
// restored) in full — without the cap, a sandbox's sparse terabyte would
// keep it frozen for as long as it takes to compress.
// The archive is not synced to disk: call Sync before recording it (a
// caller that froze the sandbox for the copy thaws it first). user is the
// sandbox's user (inside its namespace): recorded, so that a restore or fork
// gives that user's files to its own user.
func WriteSnapshot(dir string, sections map[string]string, maxBytes, maxContent int64, ids IDRange, user int) (_ *SnapshotFile, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".partial-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		_ = tmp.Close()
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(tmp, h), max: maxBytes}
	// One encoder goroutine: the output (hence the digest) depends only on
	// the input.
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	tw := tar.NewWriter(zw)
	out := &SnapshotFile{maxContent: maxContent, links: map[[2]uint64]string{}}
	for _, sec := range snapshotSections {
		src, ok := sections[sec]
		if !ok {
			continue
		}
		if err := archiveDir(tw, sec, src, out, ids, user); err != nil {
			_ = zw.Close()
			if cw.over {
				return nil, ErrSnapshotTooLarge
			}
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, snapshotWriteErr(cw, err)
	}
	if err := zw.Close(); err != nil {
		return nil, snapshotWriteErr(cw, err)
	}
	out.Digest = hex.EncodeToString(h.Sum(nil))
	out.Size = cw.n
	out.Path = filepath.Join(dir, out.Digest+SnapshotSuffix)
	if err := os.Rename(tmp.Name(), out.Path); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return out, nil
}

// Sync makes the archive and its name durable.
func (f *SnapshotFile) Sync() error {
	for _, p := range []string{f.Path, filepath.Dir(f.Path)} {
		fd, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("sync snapshot: %w", err)
		}
		err = fd.Sync()
		fd.Close()
		if err != nil {
			return fmt.Errorf("sync snapshot: %w", err)
		}
	}
	return nil
}

func snapshotWriteErr(cw *countingWriter, err error) error {
	if cw.over {
		return ErrSnapshotTooLarge
	}
	return fmt.Errorf("snapshot: %w", err)
}

type countingWriter struct {
	w    io.Writer
	n    int64
	max  int64
	over bool
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.max > 0 && c.n+int64(len(p)) > c.max {
		c.over = true
		return 0, ErrSnapshotTooLarge
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// archiveDir adds src's tree below the name sec. It does not follow
// symlinks; sockets are skipped (they mean nothing without their process).
func archiveDir(tw *tar.Writer, sec, src string, out *SnapshotFile, ids IDRange, user int) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", sec, err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := sec
		if rel != "." {
			name = sec + "/" + filepath.ToSlash(rel)
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", name, err)
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return fmt.Errorf("snapshot %s: %w", name, err)
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", name, err)
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, seen := out.links[key]; seen {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				out.links[key] = name
			}
		}
		// Numeric owners only, as the sandbox sees them: names would be the
		// host's, not the image's, and host ids its user namespace's.
		hdr.Uname, hdr.Gname = "", ""
		hdr.Uid, hdr.Gid = ids.inside(hdr.Uid), ids.inside(hdr.Gid)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if x, err := readXattrs(p, sec == SectionUpper); err != nil {
			return fmt.Errorf("snapshot %s: %w", name, err)
		} else if len(x) > 0 {
			hdr.PAXRecords = x
		}
		if rel == "." {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords[userPAXKey] = strconv.Itoa(user)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		out.Entries++
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		return out.copyContent(tw, p, name, fi.Size())
	})
}

// copyContent writes regular file p's size bytes (never through a
// symlink) after its header, within the files' cap.
func (out *SnapshotFile) copyContent(tw *tar.Writer, p, name string, size int64) error {
	if out.maxContent > 0 && out.ContentBytes+size > out.maxContent {
		return fmt.Errorf("%w: %s brings them past %d bytes", ErrSnapshotContentTooLarge, name, out.maxContent)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", name, err)
	}
	defer f.Close()
	n, err := io.CopyN(tw, f, size)
	out.ContentBytes += n
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", name, err)
	}
	return nil
}

// readXattrs returns p's user.* attributes, and the overlay's opaque marker
// when upper is set, as PAX records.
func readXattrs(p string, upper bool) (map[string]string, error) {
	names, err := listXattrs(p)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range names {
		if !strings.HasPrefix(n, "user.") && !(upper && n == opaqueXattr) {
			continue
		}
		v, err := getXattr(p, n)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[xattrPAXPrefix+n] = string(v)
	}
	return out, nil
}

func listXattrs(p string) ([]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return nil, err
	}
	var out []string
	for _, n := range bytes.Split(buf[:sz], []byte{0}) {
		if len(n) > 0 {
			out = append(out, string(n))
		}
	}
	return out, nil
}

func getXattr(p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}

// SnapshotEntries lists the paths (relative, slash-separated) of section
// sec of the archive at archive.
func SnapshotEntries(archive, sec string) (map[string]bool, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, fmt.Errorf("open snapshot: %w", err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	defer zr.Close()
	out := map[string]bool{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read snapshot: %w", err)
		}
		s, rel, err := splitEntry(hdr.Name)
		if err != nil {
			return nil, err
		}
		if s == sec {
			out[rel] = true
		}
	}
}

// ApplyTargets are where Apply puts each section of a snapshot.
type ApplyTargets struct {
	// Rootfs is the host path of the sandbox's mounted overlay (the merged
	// view): the upper section is applied through it, so that overlayfs
	// itself makes the upper layer's copies and whiteouts, and its lower
	// layer, the image, is never written. Empty: skip the section.
	Rootfs string
	// SkipRoot names paths of the upper section (relative, slash-separated)
	// that are not applied, nor anything below them: files the daemon
	// writes per sandbox (/etc/hosts, /etc/hostname, /etc/resolv.conf) and
	// the runtime's mount points (replacing a mount point on the host
	// would detach what a running sandbox has mounted there).
	SkipRoot  []string
	Workspace string
	Tmp       string
	// UID is the sandbox's user: the only owner besides root kept from the
	// archive.
	UID int
	// IDs is the sandbox's user namespace range: owners are written as
	// the host ids of the archive's (sandbox-side) ones.
	IDs IDRange
	// MaxBytes > 0 bounds the bytes of file content extracted.
	MaxBytes int64
}

// ClearDir removes everything below dir, keeping dir. Names are resolved
// inside dir (os.Root), so a symlink in it is removed, never followed.
func ClearDir(dir string) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := r.RemoveAll(n); err != nil {
			return err
		}
	}
	return nil
}

// ApplySnapshot extracts the archive at archive into t. The workspace and
// tmp sections replace their targets' contents entirely (the caller has
// made sure nothing runs there); the upper section is laid over t.Rootfs.
func ApplySnapshot(archive string, t ApplyTargets) error {
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	defer zr.Close()
	// The upper section's owners map by the general rule only: root's
	// files there are the system's (a root-mode sandbox's apt-get), not its
	// user's.
	general := ownerMap{uid: t.UID, ids: t.IDs, from: -1}
	a := &applier{
		t: t, roots: map[string]*os.Root{}, files: map[string]bool{},
		targets: map[string]string{SectionUpper: t.Rootfs, SectionWorkspace: t.Workspace, SectionTmp: t.Tmp},
		owners:  map[string]ownerMap{SectionUpper: general, SectionWorkspace: general, SectionTmp: general},
	}
	defer func() {
		for _, r := range a.roots {
			r.Close()
		}
	}()
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		if err := a.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Directory mtimes last: creating their entries changed them.
	for i := len(a.dirTimes) - 1; i >= 0; i-- {
		d := a.dirTimes[i]
		_ = d.root.Chtimes(d.rel, d.mtime, d.mtime)
	}
	return nil
}

// applier is one ApplySnapshot: the sections' targets, opened as they
// come, and what it has written so far.
type applier struct {
	t        ApplyTargets
	targets  map[string]string   // section → its directory ("": not applied)
	roots    map[string]*os.Root // the sections opened so far
	owners   map[string]ownerMap
	written  int64 // bytes of file content
	dirTimes []dirTime
	files    map[string]bool // regular files extracted so far: what a hard link may name
}

// entry applies one entry of the archive, with content read from tr.
func (a *applier) entry(hdr *tar.Header, tr io.Reader) error {
	sec, rel, err := splitEntry(hdr.Name)
	if err != nil {
		return err
	}
	dst := a.targets[sec]
	if dst == "" {
		return nil
	}
	r := a.roots[sec]
	if r == nil {
		if r, err = openSection(sec, dst); err != nil {
			return err
		}
		a.roots[sec] = r
	}
	if sec == SectionUpper && UnderAny(rel, a.t.SkipRoot) {
		return nil
	}
	if rel == "." && sec != SectionUpper {
		if a.owners[sec], err = sectionOwners(hdr, a.t.UID, a.t.IDs); err != nil {
			return err
		}
	}
	if hdr.Typeflag == tar.TypeReg {
		if a.t.MaxBytes > 0 && a.written+hdr.Size > a.t.MaxBytes {
			return fmt.Errorf("snapshot: %s: content exceeds %d bytes", hdr.Name, a.t.MaxBytes)
		}
		a.written += hdr.Size
	}
	if hdr.Typeflag == tar.TypeLink && !a.files[hdr.Linkname] {
		return fmt.Errorf("restore %s: hard link to %q, which is not an earlier file of the snapshot", hdr.Name, hdr.Linkname)
	}
	if err := applyEntry(r, sec, rel, hdr, tr, a.owners[sec]); err != nil {
		return fmt.Errorf("restore %s: %w", hdr.Name, err)
	}
	if hdr.Typeflag == tar.TypeReg {
		a.files[sec+"/"+rel] = true
	}
	if hdr.Typeflag == tar.TypeDir {
		a.dirTimes = append(a.dirTimes, dirTime{r, rel, hdr.ModTime})
	}
	return nil
}

type dirTime struct {
	root  *os.Root
	rel   string
	mtime time.Time
}

// UnderAny reports whether rel (slash-separated, relative) is one of
// prefixes or below one of them.
func UnderAny(rel string, prefixes []string) bool {
	for _, p := range prefixes {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// splitEntry checks an entry's name: a known section, then a clean
// relative path ("." for the section's own directory).
func splitEntry(name string) (sec, rel string, err error) {
	name = strings.TrimSuffix(name, "/")
	sec, rel, _ = strings.Cut(name, "/")
	if !slices.Contains(snapshotSections, sec) {
		return "", "", fmt.Errorf("snapshot: entry %q outside the known sections", name)
	}
	if rel == "" {
		return sec, ".", nil
	}
	if path.Clean(rel) != rel || path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, 0) {
		return "", "", fmt.Errorf("snapshot: entry %q is not a clean relative path", name)
	}
	return sec, rel, nil
}

// openSection opens a section's target, emptied first unless it is the
// root file system (the upper section is laid over it).
func openSection(sec, dst string) (*os.Root, error) {
	if sec != SectionUpper {
		if err := ClearDir(dst); err != nil {
			return nil, fmt.Errorf("clear %s: %w", sec, err)
		}
	}
	r, err := os.OpenRoot(dst)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", sec, err)
	}
	return r, nil
}

// ownerMap turns an archive's owners (the sandbox's view) into the host ids
// a restored entry gets.
type ownerMap struct {
	uid int     // the new sandbox's user
	ids IDRange // the new sandbox's user namespace
	// from is the user of the sandbox that took the snapshot, whose files
	// become uid's; -1: not recorded (nobody's files change hands).
	from int
}

// host is the host id that archive owner id is restored as: root's and the
// user's are kept, the snapshot's user's become the new user's, anything
// else is the new user's.
func (o ownerMap) host(id int) int {
	if id == o.from || (id != 0 && id != o.uid) {
		id = o.uid
	}
	return o.ids.host(id)
}

// sectionOwners reads the snapshot's user from a workspace or tmp
// section's own entry. The value is sandbox-reachable only through the
// daemon, but it is checked like everything else of an archive: it picks
// only which owner becomes the new user (root's or the user's ids are the
// only outcomes).
func sectionOwners(hdr *tar.Header, uid int, ids IDRange) (ownerMap, error) {
	o := ownerMap{uid: uid, ids: ids, from: -1}
	v, ok := hdr.PAXRecords[userPAXKey]
	if !ok {
		return o, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > overflowID {
		return o, fmt.Errorf("restore %s: %s %q is not a user id", hdr.Name, userPAXKey, v)
	}
	o.from = n
	return o, nil
}

// applyEntry creates one entry inside r (see the security notes above).
func applyEntry(r *os.Root, sec, rel string, hdr *tar.Header, content io.Reader, owners ownerMap) error {
	mode := fs.FileMode(hdr.Mode) & (fs.ModePerm)
	if hdr.Mode&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	owner, group := owners.host(hdr.Uid), owners.host(hdr.Gid)
	replace := func() error { return replaceEntry(r, rel, hdr.Typeflag == tar.TypeDir) }
	switch hdr.Typeflag {
	case tar.TypeChar:
		// The overlay's whiteout: the path is deleted in this layer.
		if sec != SectionUpper || hdr.Devmajor != 0 || hdr.Devminor != 0 || rel == "." {
			return fmt.Errorf("device nodes are not restored")
		}
		return r.RemoveAll(rel)
	case tar.TypeDir:
		if err := replace(); err != nil {
			return err
		}
		if hdr.Mode&unix.S_ISGID != 0 {
			mode |= fs.ModeSetgid
		}
		return applyDir(r, sec, rel, hdr, mode, owner, group)
	case tar.TypeReg:
		if err := replace(); err != nil {
			return err
		}
		return applyFile(r, rel, hdr, content, mode, owner, group)
	case tar.TypeSymlink:
		if err := replace(); err != nil {
			return err
		}
		if rel == "." {
			return fmt.Errorf("a section cannot be a symlink")
		}
		// The target is stored as is: it is resolved inside the sandbox,
		// and Root refuses to follow it out of the target here.
		if err := r.Symlink(hdr.Linkname, rel); err != nil {
			return err
		}
		return r.Lchown(rel, owner, group)
	case tar.TypeLink:
		lsec, lrel, err := splitEntry(hdr.Linkname)
		if err != nil {
			return err
		}
		if lsec != sec || lrel == "." {
			return fmt.Errorf("hard link to %q outside its section", hdr.Linkname)
		}
		if fi, err := r.Lstat(lrel); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("hard link to %q: not a regular file of the snapshot (%v)", hdr.Linkname, err)
		}
		if err := replace(); err != nil {
			return err
		}
		return r.Link(lrel, rel)
	case tar.TypeFifo:
		if err := replace(); err != nil {
			return err
		}
		return mkfifoIn(r, rel, uint32(mode.Perm()), owner, group)
	default:
		return fmt.Errorf("entry type %q is not restored", hdr.Typeflag)
	}
}

// replaceEntry clears the way for an entry at rel: what is there goes,
// except a directory that a directory entry keeps (its entries follow).
func replaceEntry(r *os.Root, rel string, isDir bool) error {
	if rel == "." {
		return nil
	}
	fi, err := r.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() && isDir {
		return nil
	}
	return r.RemoveAll(rel)
}

// applyDir makes directory rel (an opaque one of the upper section
// emptied: nothing of the lower directory shows through) with its owner,
// mode and user xattrs.
func applyDir(r *os.Root, sec, rel string, hdr *tar.Header, mode fs.FileMode, owner, group int) error {
	if rel != "." {
		if err := r.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if sec == SectionUpper && hdr.PAXRecords[xattrPAXPrefix+opaqueXattr] == "y" {
		if err := clearRootDir(r, rel); err != nil {
			return err
		}
	}
	// A section's own directory keeps the owner the sandbox's layout gave
	// it: /workspace its user's, /tmp (and "/") root's, whoever owned the
	// snapshot's.
	if rel != "." {
		if err := r.Lchown(rel, owner, group); err != nil {
			return err
		}
	}
	if err := r.Chmod(rel, mode); err != nil {
		return err
	}
	return setUserXattrs(r, rel, hdr, true)
}

// applyFile writes regular file rel, new (O_EXCL, never through a link),
// with its owner, mode (no setuid or setgid), user xattrs and times.
func applyFile(r *os.Root, rel string, hdr *tar.Header, content io.Reader, mode fs.FileMode, owner, group int) error {
	f, err := r.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, content, hdr.Size)
	if err == nil {
		err = f.Chown(owner, group)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = fsetUserXattrs(int(f.Fd()), hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return r.Chtimes(rel, hdr.ModTime, hdr.ModTime)
}

// clearRootDir removes every entry of directory rel of r.
func clearRootDir(r *os.Root, rel string) error {
	d, err := r.Open(rel)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := r.RemoveAll(path.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}

// setUserXattrs sets hdr's user.* attributes on rel through a descriptor
// opened inside r (a directory here; O_NOFOLLOW'd by Root's resolution).
func setUserXattrs(r *os.Root, rel string, hdr *tar.Header, dir bool) error {
	if !hasUserXattrs(hdr) {
		return nil
	}
	flags := os.O_RDONLY
	if dir {
		flags |= unix.O_DIRECTORY
	}
	f, err := r.OpenFile(rel, flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return fsetUserXattrs(int(f.Fd()), hdr)
}

func hasUserXattrs(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix+"user.") {
			return true
		}
	}
	return false
}

func fsetUserXattrs(fd int, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok || !strings.HasPrefix(name, "user.") {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

// mkfifoIn makes a fifo at rel inside r: mknodat relative to its parent
// directory's descriptor, opened through r.
func mkfifoIn(r *os.Root, rel string, perm uint32, uid, gid int) error {
	parent, err := r.OpenFile(path.Dir(rel), os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer parent.Close()
	base := path.Base(rel)
	if err := unix.Mknodat(int(parent.Fd()), base, syscall.S_IFIFO|perm, 0); err != nil {
		return err
	}
	if err := unix.Fchownat(int(parent.Fd()), base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return unix.Fchmodat(int(parent.Fd()), base, perm, 0)
}

// IDRange is a sandbox's user namespace mapping: its id 0 is host id Base,
// for Size ids. Archives hold the sandbox's view of owners, so that a
// snapshot restores into (and forks to) a sandbox of any range, or of none.
// The zero value is the identity: no user namespace.
type IDRange struct {
	Base, Size int
}

// overflowID is the kernel's overflowuid/overflowgid: what the sandbox
// sees for a host id outside its range.
const overflowID = 65534

// inside is the sandbox's view of host id.
func (m IDRange) inside(id int) int {
	if m.Size == 0 {
		return id
	}
	if id >= m.Base && id < m.Base+m.Size {
		return id - m.Base
	}
	return overflowID
}

// host is the host id of the sandbox's id.
func (m IDRange) host(id int) int {
	if m.Size == 0 {
		return id
	}
	return m.Base + id
}
