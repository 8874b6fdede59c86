package oci

// The layers of a Dockerfile build: what a RUN step changed (the sandbox's
// overlay upper layer, turned into an OCI layer with whiteouts), what a
// COPY or ADD brings from the build context, and the build context itself
// as an upload unpacks it. The context is the client's and hostile: names
// with "..", absolute names and symlinks leading out of it are refused,
// naming the entry.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// layerTime is the modification time of every entry a COPY writes: a
// context re-sent with new mtimes (a fresh checkout) is the same layer and
// a cache hit, as BuildKit's content checksums ignore mtimes too.
var layerTime = time.Unix(0, 0).UTC()

// WriteUpperLayer writes the changes of an overlay upper directory as an
// uncompressed OCI layer to w: overlayfs's whiteouts (character devices
// 0:0) become ".wh." entries, its opaque directories a ".wh..wh..opq"
// entry. Paths under skip (relative, the daemon's own files of a sandbox)
// are left out, and so are sockets and device nodes. Owners are turned
// from host ids to the sandbox's (idBase, idSize; idSize 0: as they are).
func WriteUpperLayer(upper string, skip []string, idBase, idSize int, w io.Writer) error {
	lw := &upperLayerWriter{tw: tar.NewWriter(w), upper: upper, skip: skip, idBase: idBase, idSize: idSize, links: map[[2]uint64]string{}}
	if err := filepath.WalkDir(upper, lw.entry); err != nil {
		return fmt.Errorf("layer of the step's changes: %w", err)
	}
	return lw.tw.Close()
}

// upperLayerWriter is one WriteUpperLayer: the walk's callback and what it
// carries from one entry to the next.
type upperLayerWriter struct {
	tw             *tar.Writer
	upper          string
	skip           []string
	idBase, idSize int
	links          map[[2]uint64]string // (dev, inode) of files with several links → first name
}

// inside is the sandbox's id of host id id (the overflow id outside its
// range).
func (lw *upperLayerWriter) inside(id int) int {
	if lw.idSize == 0 {
		return id
	}
	if id >= lw.idBase && id < lw.idBase+lw.idSize {
		return id - lw.idBase
	}
	return 65534
}

// skipped reports whether rel is one of the daemon's own paths or below one.
func (lw *upperLayerWriter) skipped(rel string) bool {
	for _, s := range lw.skip {
		s = strings.Trim(s, "/")
		if rel == s || strings.HasPrefix(rel, s+"/") {
			return true
		}
	}
	return false
}

// entry writes the walk's entry p (a fs.WalkDirFunc).
func (lw *upperLayerWriter) entry(p string, d fs.DirEntry, err error) error {
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(lw.upper, p)
	if err != nil || rel == "." {
		return err
	}
	rel = filepath.ToSlash(rel)
	if lw.skipped(rel) {
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	}
	fi, err := d.Info()
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	mode := fi.Mode()
	if mode&fs.ModeCharDevice != 0 && st != nil && st.Rdev == 0 {
		dir, base := path.Split(rel)
		return lw.tw.WriteHeader(&tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime(), Format: tar.FormatPAX})
	}
	if mode&(fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0 {
		return nil
	}
	hdr, err := lw.header(p, rel, fi, st)
	if err != nil {
		return err
	}
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if fi.IsDir() {
		if v, err := getxattr(p, "trusted.overlay.opaque"); err == nil && v == "y" {
			return lw.tw.WriteHeader(&tar.Header{Name: rel + "/" + opaqueMarker, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		}
		return nil
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(lw.tw, f, hdr.Size)
	return err
}

// header is the tar header of entry rel: owners as the sandbox sees them,
// no names or access times (the layer's bytes depend on the files only),
// a second name of a file a hard link to its first.
func (lw *upperLayerWriter) header(p, rel string, fi fs.FileInfo, st *syscall.Stat_t) (*tar.Header, error) {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return nil, err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil, err
	}
	hdr.Name = rel
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Uid, hdr.Gid = lw.inside(hdr.Uid), lw.inside(hdr.Gid)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	if st != nil && fi.Mode().IsRegular() && st.Nlink > 1 {
		k := [2]uint64{st.Dev, st.Ino}
		if first, ok := lw.links[k]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			lw.links[k] = rel
		}
	}
	return hdr, nil
}

func getxattr(p, name string) (string, error) {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// UnpackContext unpacks an uploaded build context (a tar, optionally
// gzip- or zstd-compressed) into the empty directory dir, at most max
// bytes of files. Only directories, regular files and symlinks that stay
// inside the context are taken; anything else is refused naming the entry.
func UnpackContext(r io.Reader, dir string, max int64) error {
	data, err := decompress(bufio.NewReaderSize(r, 1<<16))
	if err != nil {
		return errdefs.Invalidf("context: %v", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(data)
	left := max
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.Invalidf("context: malformed tar: %v", err)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
		}
		if name == "" {
			continue
		}
		if err := makeParents(root, path.Dir(name)); err != nil {
			return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
			}
			if err := root.Chmod(name, mode|0o700); err != nil {
				return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
			}
		case tar.TypeReg:
			if left -= hdr.Size; left < 0 {
				return errdefs.LimitExceededf("context: entry %q: the context exceeds %d bytes", hdr.Name, max)
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600)
			if err != nil {
				return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if path.IsAbs(hdr.Linkname) || escapes(path.Dir(name), hdr.Linkname) {
				return errdefs.Invalidf("context: entry %q: symlink to %q leads out of the context", hdr.Name, hdr.Linkname)
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return errdefs.Invalidf("context: entry %q: %v", hdr.Name, err)
			}
		default:
			return errdefs.Invalidf("context: entry %q: type %q refused (directories, regular files and symlinks only)", hdr.Name, hdr.Typeflag)
		}
	}
}

// copySource is one file a COPY takes from the context.
type copySource struct {
	rel  string // in the context
	dest string // in the image, relative to its root
}

// stepCopy writes the layer of a COPY or ADD of the context and records
// its cache key.
func (im *Importer) stepCopy(req BuildRequest, s *buildState, loc []parser.Range, what string, sd instructions.SourcesAndDest, chown, chmod string, excludes []string, parents bool, ev *apitypes.BuildProgress) error {
	if len(sd.SourceContents) > 0 {
		return lineError(loc, "%s with a heredoc is not supported", what)
	}
	if len(excludes) > 0 || parents {
		return lineError(loc, "%s --exclude and --parents are not supported", what)
	}
	if req.Context == "" {
		return lineError(loc, "%s: the build has no context", what)
	}
	cp := &contextCopy{loc: loc, what: what, perm: -1}
	if chown != "" {
		var err error
		if cp.uid, cp.gid, err = im.chownIDs(s, chown); err != nil {
			return lineError(loc, "%s --chown=%s: %v", what, chown, err)
		}
	}
	if chmod != "" {
		v, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || v > 0o7777 {
			return lineError(loc, "%s --chmod=%s: an octal mode is expected", what, chmod)
		}
		cp.perm = int64(v)
	}
	dest, destIsDir := copyDest(s, sd)
	root, err := os.OpenRoot(req.Context)
	if err != nil {
		return err
	}
	defer root.Close()
	cp.root = root
	files, err := cp.sources(sd.SourcePaths, dest, destIsDir)
	if err != nil {
		return err
	}
	d, err := im.storeLayer(func(w io.Writer) error { return cp.writeLayer(w, files) })
	if err != nil {
		return err
	}
	key := chain(s.key, what, dest, chown, chmod, d)
	ev.Layer, ev.Cached = "sha256:"+d, im.cached(key) == d
	if !ev.Cached {
		if err := im.remember(key, d); err != nil {
			return err
		}
	}
	s.key, s.layers = key, append(s.layers, d)
	if len(s.layers) > maxLayers {
		return lineError(loc, "more than %d layers", maxLayers)
	}
	return nil
}

// copyDest is a COPY's destination, relative to the image's root (a
// relative one is below the WORKDIR), and whether it is a directory (a
// trailing "/", a last element "." or "..", as BuildKit reads it, or
// several sources). "COPY main.py ." is main.py in the WORKDIR, not a file
// named as the WORKDIR (found by FuzzDockerfileBuild).
func copyDest(s *buildState, sd instructions.SourcesAndDest) (string, bool) {
	dest := sd.DestPath
	last := path.Base(dest)
	destIsDir := strings.HasSuffix(dest, "/") || last == "." || last == ".." || len(sd.SourcePaths) > 1
	if !path.IsAbs(dest) {
		wd := s.cfg.WorkingDir
		if wd == "" {
			wd = "/"
		}
		dest = path.Join(wd, dest)
	}
	return strings.TrimPrefix(path.Clean(dest), "/"), destIsDir
}

// contextCopy is one COPY or ADD from the build context: the context
// (opened as a root, so nothing resolves out of it) and the owners and
// mode the layer's entries get (perm -1: the context's).
type contextCopy struct {
	root     *os.Root
	loc      []parser.Range
	what     string // COPY or ADD, for errors
	uid, gid int
	perm     int64
}

// sources lists the files the sources bring (globs expanded, directories
// walked), sorted by their destination.
func (cp *contextCopy) sources(srcs []string, dest string, destIsDir bool) ([]copySource, error) {
	var files []copySource
	for _, src := range srcs {
		matches, err := cp.match(src)
		if err != nil {
			return nil, err
		}
		if len(matches) > 1 {
			destIsDir = true
		}
		for _, m := range matches {
			if files, err = cp.addMatch(files, src, m, dest, destIsDir); err != nil {
				return nil, err
			}
		}
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].dest < files[j].dest })
	return files, nil
}

// match is what source src names in the context: itself, or what its glob
// matches (at least one).
func (cp *contextCopy) match(src string) ([]string, error) {
	clean := strings.TrimPrefix(path.Clean("/"+src), "/")
	for _, part := range strings.Split(src, "/") {
		if part == ".." {
			return nil, lineError(cp.loc, "%s %s: \"..\" leads out of the context", cp.what, src)
		}
	}
	if clean == "" {
		clean = "."
	}
	matches := []string{clean}
	if strings.ContainsAny(clean, `*?[\`) {
		var err error
		if matches, err = fs.Glob(cp.root.FS(), clean); err != nil {
			return nil, lineError(cp.loc, "%s %s: %v", cp.what, src, err)
		}
	}
	if len(matches) == 0 {
		return nil, lineError(cp.loc, "%s %s: no such file in the context", cp.what, src)
	}
	return matches, nil
}

// addMatch adds m, a match of source src: a file at dest (or in it), a
// directory's whole tree into dest.
func (cp *contextCopy) addMatch(files []copySource, src, m, dest string, destIsDir bool) ([]copySource, error) {
	fi, err := cp.root.Stat(m)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, lineError(cp.loc, "%s %s: no such file in the context", cp.what, src)
	}
	if err != nil {
		return nil, lineError(cp.loc, "%s %s: entry %q: %v", cp.what, src, m, contextErr(err))
	}
	if !fi.IsDir() {
		d := dest
		if destIsDir {
			d = path.Join(dest, path.Base(m))
		}
		return append(files, copySource{rel: m, dest: d}), nil
	}
	// A directory's contents go into dest, as Docker's COPY does.
	err = fs.WalkDir(cp.root.FS(), m, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(m, p)
		files = append(files, copySource{rel: p, dest: path.Join(dest, filepath.ToSlash(r))})
		return nil
	})
	if err != nil {
		return nil, lineError(cp.loc, "%s %s: %v", cp.what, src, contextErr(err))
	}
	return files, nil
}

// writeLayer writes files as an uncompressed layer to w.
func (cp *contextCopy) writeLayer(w io.Writer, files []copySource) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		hdr, err := cp.header(f)
		if err != nil {
			return err
		}
		if f.dest == "" || f.dest == "." {
			continue // the root's own entry: its mode is the image's
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			fh, err := cp.root.Open(f.rel)
			if err != nil {
				return lineError(cp.loc, "%s: entry %q: %v", cp.what, f.rel, contextErr(err))
			}
			_, err = io.CopyN(tw, fh, hdr.Size)
			fh.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// header is the layer's entry of f: a symlink only when it stays inside
// the context, nothing but files, directories and symlinks.
func (cp *contextCopy) header(f copySource) (*tar.Header, error) {
	fi, err := cp.root.Lstat(f.rel)
	if err != nil {
		return nil, lineError(cp.loc, "%s: entry %q: %v", cp.what, f.rel, contextErr(err))
	}
	hdr := &tar.Header{Name: f.dest, Uid: cp.uid, Gid: cp.gid, ModTime: layerTime, Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := cp.root.Readlink(f.rel)
		if err != nil {
			return nil, lineError(cp.loc, "%s: entry %q: %v", cp.what, f.rel, err)
		}
		if path.IsAbs(target) || escapes(path.Dir(f.rel), target) {
			return nil, lineError(cp.loc, "%s: entry %q: symlink to %q leads out of the context", cp.what, f.rel, target)
		}
		hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, f.dest+"/"
	case fi.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	default:
		return nil, lineError(cp.loc, "%s: entry %q: not a file, directory or symlink", cp.what, f.rel)
	}
	if cp.perm >= 0 && hdr.Typeflag != tar.TypeSymlink {
		hdr.Mode = cp.perm
	}
	return hdr, nil
}

// contextErr says that an error of os.Root is a path leading out of the
// context.
func contextErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return errors.New("a symlink leads out of the context")
	}
	return err
}

// chownIDs resolves a --chown user[:group] to ids: numbers as they are,
// names in the state's /etc/passwd and /etc/group (the newest layer that
// has them, else the base's).
func (im *Importer) chownIDs(s *buildState, spec string) (int, int, error) {
	user, group, hasGroup := strings.Cut(spec, ":")
	lookup := func(file, name string, field int) (int, error) {
		if n, err := strconv.Atoi(name); err == nil {
			return n, nil
		}
		data, err := im.stateFile(s, file)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Split(line, ":")
			if len(f) > field && f[0] == name {
				return strconv.Atoi(f[field])
			}
		}
		return 0, fmt.Errorf("no %q in the image's /%s", name, file)
	}
	uid, err := lookup("etc/passwd", user, 2)
	if err != nil {
		return 0, 0, err
	}
	gid := uid
	if hasGroup {
		if gid, err = lookup("etc/group", group, 2); err != nil {
			return 0, 0, err
		}
	} else if _, err := strconv.Atoi(user); err != nil {
		if gid, err = lookup("etc/passwd", user, 3); err != nil {
			return 0, 0, err
		}
	}
	if uid < 0 || gid < 0 || uid >= im.o.MaxID || gid >= im.o.MaxID {
		return 0, 0, fmt.Errorf("id outside the sandbox's id range 0-%d", im.o.MaxID-1)
	}
	return uid, gid, nil
}

// stateFile reads file (relative) as the build's state has it: from the
// newest of its layers that holds it, else from the base's tree.
func (im *Importer) stateFile(s *buildState, file string) ([]byte, error) {
	for i := len(s.layers) - 1; i >= 0; i-- {
		f, err := os.Open(filepath.Join(im.layers, s.layers[i]))
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(bufio.NewReader(f))
		for {
			hdr, err := tr.Next()
			if err != nil {
				break
			}
			if strings.TrimPrefix(path.Clean("/"+hdr.Name), "/") == file && hdr.Typeflag == tar.TypeReg && hdr.Size < 4<<20 {
				data, err := io.ReadAll(tr)
				f.Close()
				return data, err
			}
		}
		f.Close()
	}
	root, err := os.OpenRoot(s.base.Rootfs)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.ReadFile(file)
}

// ContextDir makes an empty directory for a build context beside the
// layer store (a crashed daemon's are removed as abandoned spool).
func (im *Importer) ContextDir() (string, error) {
	return os.MkdirTemp(im.layers, ".context-")
}
