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
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	inside := func(id int) int {
		if idSize == 0 {
			return id
		}
		if id >= idBase && id < idBase+idSize {
			return id - idBase
		}
		return 65534
	}
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		for _, s := range skip {
			s = strings.Trim(s, "/")
			if rel == s || strings.HasPrefix(rel, s+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode()
		if mode&fs.ModeCharDevice != 0 && st != nil && st.Rdev == 0 {
			dir, base := path.Split(rel)
			return tw.WriteHeader(&tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		}
		if mode&(fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0 {
			return nil
		}
		link := ""
		if mode&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Uid, hdr.Gid = inside(hdr.Uid), inside(hdr.Gid)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if st != nil && mode.IsRegular() && st.Nlink > 1 {
			k := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[k]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[k] = rel
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.IsDir() {
			if v, err := getxattr(p, "trusted.overlay.opaque"); err == nil && v == "y" {
				return tw.WriteHeader(&tar.Header{Name: rel + "/" + opaqueMarker, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime(), Format: tar.FormatPAX})
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
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
	if err != nil {
		return fmt.Errorf("layer of the step's changes: %w", err)
	}
	return tw.Close()
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
	uid, gid := 0, 0
	if chown != "" {
		var err error
		if uid, gid, err = im.chownIDs(s, chown); err != nil {
			return lineError(loc, "%s --chown=%s: %v", what, chown, err)
		}
	}
	var perm int64 = -1
	if chmod != "" {
		v, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || v > 0o7777 {
			return lineError(loc, "%s --chmod=%s: an octal mode is expected", what, chmod)
		}
		perm = int64(v)
	}
	dest := sd.DestPath
	if !path.IsAbs(dest) {
		wd := s.cfg.WorkingDir
		if wd == "" {
			wd = "/"
		}
		dest = path.Join(wd, dest) + map[bool]string{true: "/"}[strings.HasSuffix(sd.DestPath, "/")]
	}
	destIsDir := strings.HasSuffix(dest, "/") || len(sd.SourcePaths) > 1
	dest = strings.TrimPrefix(path.Clean(dest), "/")
	root, err := os.OpenRoot(req.Context)
	if err != nil {
		return err
	}
	defer root.Close()
	var files []copySource
	for _, src := range sd.SourcePaths {
		clean := strings.TrimPrefix(path.Clean("/"+src), "/")
		for _, part := range strings.Split(src, "/") {
			if part == ".." {
				return lineError(loc, "%s %s: \"..\" leads out of the context", what, src)
			}
		}
		if clean == "" {
			clean = "."
		}
		matches := []string{clean}
		if strings.ContainsAny(clean, `*?[\`) {
			if matches, err = fs.Glob(root.FS(), clean); err != nil {
				return lineError(loc, "%s %s: %v", what, src, err)
			}
		}
		if len(matches) == 0 {
			return lineError(loc, "%s %s: no such file in the context", what, src)
		}
		if len(matches) > 1 {
			destIsDir = true
		}
		for _, m := range matches {
			fi, err := root.Stat(m)
			if errors.Is(err, fs.ErrNotExist) {
				return lineError(loc, "%s %s: no such file in the context", what, src)
			}
			if err != nil {
				return lineError(loc, "%s %s: entry %q: %v", what, src, m, contextErr(err))
			}
			if !fi.IsDir() {
				d := dest
				if destIsDir {
					d = path.Join(dest, path.Base(m))
				}
				files = append(files, copySource{rel: m, dest: d})
				continue
			}
			// A directory's contents go into dest, as Docker's COPY does.
			err = fs.WalkDir(root.FS(), m, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				r, _ := filepath.Rel(m, p)
				files = append(files, copySource{rel: p, dest: path.Join(dest, filepath.ToSlash(r))})
				return nil
			})
			if err != nil {
				return lineError(loc, "%s %s: %v", what, src, contextErr(err))
			}
		}
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].dest < files[j].dest })
	d, err := im.storeLayer(func(w io.Writer) error {
		tw := tar.NewWriter(w)
		for _, f := range files {
			fi, err := root.Lstat(f.rel)
			if err != nil {
				return lineError(loc, "%s: entry %q: %v", what, f.rel, contextErr(err))
			}
			hdr := &tar.Header{Name: f.dest, Uid: uid, Gid: gid, ModTime: layerTime, Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := root.Readlink(f.rel)
				if err != nil {
					return lineError(loc, "%s: entry %q: %v", what, f.rel, err)
				}
				if path.IsAbs(target) || escapes(path.Dir(f.rel), target) {
					return lineError(loc, "%s: entry %q: symlink to %q leads out of the context", what, f.rel, target)
				}
				hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
			case fi.IsDir():
				hdr.Typeflag, hdr.Name = tar.TypeDir, f.dest+"/"
			case fi.Mode().IsRegular():
				hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			default:
				return lineError(loc, "%s: entry %q: not a file, directory or symlink", what, f.rel)
			}
			if perm >= 0 && hdr.Typeflag != tar.TypeSymlink {
				hdr.Mode = perm
			}
			if f.dest == "" || f.dest == "." {
				continue // the root's own entry: its mode is the image's
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if hdr.Typeflag == tar.TypeReg {
				fh, err := root.Open(f.rel)
				if err != nil {
					return lineError(loc, "%s: entry %q: %v", what, f.rel, contextErr(err))
				}
				_, err = io.CopyN(tw, fh, hdr.Size)
				fh.Close()
				if err != nil {
					return err
				}
			}
		}
		return tw.Close()
	})
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
