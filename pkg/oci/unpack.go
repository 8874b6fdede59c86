package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Trust boundary: everything in a layer is hostile until it has passed
// applyLayer. The tree being filled is a private directory of the image
// store that no sandbox uses yet, and every file operation goes through
// os.Root, so that a path or a symlink planted by an earlier entry can never
// make a later one reach outside it. On top of that, entries that are
// harmless to os.Root but wrong in an image are refused outright, naming
// the layer and the entry: "..", absolute paths, links whose target climbs
// out of the tree, devices, ids outside the sandbox's id range (a setuid
// file owned by a host id would keep its power outside the sandbox), and
// more uncompressed bytes than the image may have.

// whiteoutPrefix marks a deleted entry, opaqueMarker a directory whose
// lower-layer contents are hidden (the OCI image spec's whiteouts).
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// budget is what the whole image may still take once unpacked.
type budget struct {
	left int64 // uncompressed layer bytes still allowed
	max  int64
}

// countingReader fails once more than b.left bytes have been read: a
// decompression bomb stops at the limit, not when the disk is full.
type countingReader struct {
	r io.Reader
	b *budget
	n int64 // bytes read
}

var errBudget = errors.New("budget exceeded")

func (c *countingReader) Read(p []byte) (int, error) {
	if c.b.left <= 0 {
		return 0, errBudget
	}
	if int64(len(p)) > c.b.left+1 {
		p = p[:c.b.left+1]
	}
	n, err := c.r.Read(p)
	c.b.left -= int64(n)
	c.n += int64(n)
	if c.b.left < 0 {
		return n, errBudget
	}
	return n, err
}

// applyLayer extracts the uncompressed tar stream r (read through a
// countingReader of b), the layer called layer (its index and diff id, for
// messages), onto the tree at root.
// maxID bounds the uids and gids files may have (the size of a sandbox's
// id range).
func applyLayer(root *os.Root, r io.Reader, layer string, b *budget, maxID int) error {
	tr := tar.NewReader(r)
	// Entries this layer created: an opaque marker hides only what lower
	// layers put in its directory, whatever the order of the tar.
	created := map[string]bool{}
	var entry string
	refuse := func(format string, args ...any) error {
		return errdefs.Invalidf("image: layer %s: entry %q: %s", layer, entry, fmt.Sprintf(format, args...))
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, errBudget) {
				return errdefs.LimitExceededf("image: layer %s: entry %q: unpacked image exceeds images.max_size (%d bytes)", layer, entry, b.max)
			}
			return errdefs.Invalidf("image: layer %s: after entry %q: malformed tar: %v", layer, entry, err)
		}
		entry = hdr.Name
		name, err := cleanName(hdr.Name)
		if err != nil {
			return refuse("%v", err)
		}
		if name == "" {
			continue // the root itself: its mode is ours to set
		}
		if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= maxID || hdr.Gid >= maxID {
			what := "owner"
			if hdr.Mode&(0o4000|0o2000) != 0 {
				what = "setuid/setgid file's owner"
			}
			return refuse("%s %d:%d is outside the sandbox's id range 0-%d", what, hdr.Uid, hdr.Gid, maxID-1)
		}
		dir, base := path.Split(name)
		// Symlinks of lower layers in the path (Debian's /var/run ->
		// /run) are followed as the sandbox will see them: inside the
		// tree, absolute ones from its root.
		if dir, err = resolveDir(root, strings.TrimSuffix(dir, "/")); err != nil {
			return refuse("%v", err)
		}
		name = path.Join(dir, base)
		if base == opaqueMarker {
			// Writers put the marker right after its directory, before
			// the layer's own entries in it; any that came earlier are
			// in created and stay.
			if err := clearLower(root, dir, created); err != nil {
				return refuse("opaque directory: %v", err)
			}
			continue
		}
		if strings.HasPrefix(base, whiteoutPrefix) {
			victim := path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
			if err := root.RemoveAll(victim); err != nil {
				return refuse("whiteout: %v", err)
			}
			continue
		}
		if err := makeParents(root, dir); err != nil {
			return refuse("%v", err)
		}
		if err := applyEntry(root, tr, hdr, name); err != nil {
			if errors.Is(err, errBudget) {
				return errdefs.LimitExceededf("image: layer %s: entry %q: unpacked image exceeds images.max_size (%d bytes)", layer, entry, b.max)
			}
			if errdefs.CodeOf(err) == errdefs.InvalidArgument {
				return refuse("%s", errdefs.MessageOf(err))
			}
			return refuse("%v", err)
		}
		for p := name; p != "." && !created[p]; p = path.Dir(p) {
			created[p] = true
		}
	}
	return nil
}

// cleanName turns a tar entry name into a path relative to the root,
// refusing absolute paths and any ".." component (even one that would stay
// inside after cleaning: a well-formed image has none).
func cleanName(n string) (string, error) {
	if strings.HasPrefix(n, "/") {
		return "", errors.New("absolute path")
	}
	if strings.ContainsRune(n, 0) {
		return "", errors.New("NUL in name")
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", errors.New(`".." in path`)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// escapes reports whether target, a link's target as seen from the link's
// directory dir, climbs out of the tree. Absolute targets are resolved in
// the sandbox's root, where they cannot leave it; relative ones can.
func escapes(dir, target string) bool {
	if path.IsAbs(target) {
		return false
	}
	depth := 0
	if dir != "" {
		depth = len(strings.Split(dir, "/"))
	}
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

// resolveDir resolves the symlinks in dir (a clean relative path) the way
// the sandbox's kernel will, with the tree as its root: an absolute target
// starts again from the tree's root, ".." stops at it. The result names no
// symlink, so os.Root (which refuses absolute targets) can use it.
func resolveDir(root *os.Root, dir string) (string, error) {
	if dir == "" || dir == "." {
		return "", nil
	}
	todo := strings.Split(dir, "/")
	var done []string
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		p := path.Join(append(append([]string{}, done...), c)...)
		fi, err := root.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c) // missing (created later) or a real entry
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%q: too many levels of symbolic links", dir)
		}
		target, err := root.Readlink(p)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return path.Join(done...), nil
}

// makeParents creates the missing directories above an entry (a tar need
// not list them), as root-owned 0755 directories.
func makeParents(root *os.Root, dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := root.Lstat(dir)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return fmt.Errorf("parent %q is not a directory", dir)
	}
	return root.MkdirAll(dir, 0o755)
}

// applyEntry writes one entry. An existing entry at name is replaced,
// except that a directory over a directory keeps the lower one's contents.
func applyEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string) error {
	old, err := root.Lstat(name)
	exists := err == nil
	if exists && !(old.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := root.RemoveAll(name); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !exists || !old.IsDir() {
			if err := root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
	case tar.TypeReg: // the reader reports the old TypeRegA as TypeReg
		if err := writeRegular(root, tr, name); err != nil {
			return err
		}
	case tar.TypeSymlink:
		dir := path.Dir(name)
		if dir == "." {
			dir = ""
		}
		if escapes(dir, hdr.Linkname) {
			return errdefs.Invalidf("symlink to %q leads out of the image", hdr.Linkname)
		}
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		return hardLink(root, hdr, name)
	case tar.TypeChar, tar.TypeBlock:
		return errdefs.Invalidf("device node (%d:%d): images may not carry devices; the runtime gives every sandbox its own /dev", hdr.Devmajor, hdr.Devminor)
	case tar.TypeFifo:
		return errdefs.Invalidf("named pipe: not supported in images")
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return errdefs.Invalidf("tar entry type %q: not supported", hdr.Typeflag)
	}
	return setAttributes(root, hdr, name)
}

// writeRegular writes a new regular file (never through what was there)
// with the entry's content.
func writeRegular(root *os.Root, tr *tar.Reader, name string) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// hardLink makes name a hard link to a regular file already in the image.
func hardLink(root *os.Root, hdr *tar.Header, name string) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil || target == "" {
		return errdefs.Invalidf("hard link to %q leads out of the image", hdr.Linkname)
	}
	tdir, err := resolveDir(root, path.Dir(target))
	if err != nil {
		return errdefs.Invalidf("hard link to %q: %v", hdr.Linkname, err)
	}
	target = path.Join(tdir, path.Base(target))
	fi, err := root.Lstat(target)
	if err != nil {
		return errdefs.Invalidf("hard link to %q: no such entry in the image", hdr.Linkname)
	}
	if !fi.Mode().IsRegular() {
		// A hard link to a symlink would be followed by os.Root's
		// Link on some paths; regular files are all images need.
		return errdefs.Invalidf("hard link to %q: not a regular file", hdr.Linkname)
	}
	return root.Link(target, name)
}

// setAttributes gives a directory or regular file the entry's owner, mode
// (setuid, setgid and sticky bits included) and modification time.
func setAttributes(root *os.Root, hdr *tar.Header, name string) error {
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	// Chmod after Chown: chown clears the setuid and setgid bits.
	if err := root.Chmod(name, mode); err != nil {
		return err
	}
	mt := hdr.ModTime
	if mt.IsZero() {
		mt = time.Unix(0, 0)
	}
	return root.Chtimes(name, mt, mt)
}

// clearLower removes what lower layers left in dir: everything not
// created by the layer with the opaque marker.
func clearLower(root *os.Root, dir string, created map[string]bool) error {
	d := dir
	if d == "" {
		d = "."
	}
	f, err := root.Open(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if created[p] {
			continue
		}
		if err := root.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}
