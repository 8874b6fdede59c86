package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// errAbort marks a failure after which no error frame can be sent: the
// client has gone, or a response header already promised a payload. The
// connection is just closed and the client sees it cut short.
var errAbort = errors.New("response aborted")

// fileService serves file requests confined to a root directory.
//
// Security boundary: every path is resolved by the kernel with openat2
// relative to rootFD under RESOLVE_IN_ROOT, so ".." and absolute symlinks
// planted by sandboxed code are clamped to the root, and
// RESOLVE_NO_MAGICLINKS refuses /proc magic links that would jump out of
// it. Below a resolved directory only single components are used, with
// O_NOFOLLOW/AT_SYMLINK_NOFOLLOW. Writes and deletes are refused under
// /proc, /sys, /dev and the agent's socket directory, both by path and by
// checking the resolved parent directory.
type fileService struct {
	rootFD   int
	sockDir  string
	sockStat *unix.Stat_t // the socket directory, nil if unknown
	uid, gid int
	chown    bool // only root can give files away
}

func newFileService(root, sockDir string, uid, gid int) (*fileService, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", root, err)
	}
	fs := &fileService{rootFD: fd, sockDir: sockDir, uid: uid, gid: gid, chown: os.Geteuid() == 0}
	var st unix.Stat_t
	if err := unix.Stat(sockDir, &st); err == nil {
		fs.sockStat = &st
	}
	return fs, nil
}

func (fs *fileService) close() { unix.Close(fs.rootFD) }

// openAsUser opens p for reading with the sandbox user's credentials
// (asUser), so that what a read returns obeys the permissions the sandbox
// user faces: a link planted in /workspace pointing at a root-only file of
// the image opens with EACCES instead of through the agent's
// CAP_DAC_OVERRIDE.
func (fs *fileService) openAsUser(p string, flags uint64) (fd int, err error) {
	err = fs.asUser(func() error {
		fd, err = fs.open(p, flags, 0)
		return err
	})
	return fd, err
}

// dropsCreds reports whether file operations switch to the sandbox user:
// the agent is root and the user is not (in root mode the user is root of
// the sandbox's own user namespace, and so is the agent).
func (fs *fileService) dropsCreds() bool { return fs.chown && fs.uid != 0 }

// asUser runs f with the sandbox user's file-system credentials: every
// open, create, rename and unlink in it obeys the permissions that user
// faces, and what it creates is that user's. Security boundary: the file
// API cannot be used to read or change what sandboxed code itself cannot
// (a planted symlink to /etc/shadow, a root-owned file of the image).
// setfsuid, setfsgid and setgroups (raw syscalls here, not Go's
// all-threads versions) change this OS thread only; a non-zero fsuid drops
// the file-system capabilities from its effective set, and fsuid 0 brings
// them back. A thread whose credentials cannot be restored stays locked
// and ends with its goroutine.
func (fs *fileService) asUser(f func() error) error {
	if !fs.dropsCreds() {
		return f()
	}
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	groups, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("getgroups: %w", err)
	}
	if err := unix.Setgroups([]int{fs.gid}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	_, _ = unix.SetfsgidRetGid(fs.gid)
	_, _ = unix.SetfsuidRetUid(fs.uid)
	err = f()
	_, _ = unix.SetfsuidRetUid(0)
	_, _ = unix.SetfsgidRetGid(0)
	// setfsuid(-1) changes nothing and returns the current fsuid.
	if cur, _ := unix.SetfsuidRetUid(-1); cur == 0 && unix.Setgroups(groups) == nil {
		restored = true
	}
	return err
}

// open resolves p inside the root.
func (fs *fileService) open(p string, flags uint64, mode uint64) (int, error) {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		rel = "."
	}
	how := &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    mode,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(fs.rootFD, rel, how)
		// EAGAIN: a concurrent rename raced the lookup; it is safe to retry.
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, errnoError(p, err)
		}
		return fd, nil
	}
}

// errnoError maps a system error on p to the agent's taxonomy.
func errnoError(p string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", p, err)
	}
	var code errdefs.Code
	switch errno {
	case unix.ENOENT:
		code = errdefs.NotFound
	case unix.ENOTDIR, unix.EISDIR, unix.ELOOP, unix.EINVAL, unix.ENAMETOOLONG, unix.EXDEV,
		unix.EACCES, unix.EPERM, unix.EROFS, unix.ETXTBSY:
		code = errdefs.InvalidArgument
	case unix.EEXIST, unix.ENOTEMPTY, unix.EBUSY:
		code = errdefs.Conflict
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		code = errdefs.LimitExceeded
	default:
		return fmt.Errorf("%s: %w", p, err)
	}
	return agent.Errorf(code, "%s: %v", p, errno)
}

func (fs *fileService) serve(req *agent.Request, r *bufio.Reader, rp *reply) error {
	p := req.Path
	if req.Op == agent.OpWriteFile {
		if req.Write == nil {
			return agent.Errorf(errdefs.InvalidArgument, "write_file without write")
		}
		p = req.Write.Path
	}
	if err := agent.ValidatePath(p); err != nil {
		return err
	}
	switch req.Op {
	case agent.OpReadFile:
		return fs.read(p, req.Offset, req.Max, rp)
	case agent.OpWriteFile:
		// The payload follows the request: whatever of it a failed write
		// left unread is drained (up to the transfer cap), so the client
		// can finish sending and read the error instead of a broken pipe.
		lr := &io.LimitedReader{R: r, N: req.Len}
		err := fs.asUser(func() error { return fs.write(req.Write, req.Len, bufio.NewReaderSize(lr, 64<<10), rp) })
		if err != nil && req.Len <= agent.MaxTransferBytes {
			_, _ = io.Copy(io.Discard, lr)
		}
		return err
	case agent.OpListFiles:
		return fs.list(req, r, rp)
	case agent.OpDeleteFile:
		if err := fs.asUser(func() error { return fs.delete(p, req.Recursive) }); err != nil {
			return err
		}
		return rp.send(&agent.Frame{Type: agent.FrameResult})
	default: // agent.OpStat
		var fi *agent.FileInfo
		err := fs.asUser(func() (err error) {
			fi, err = fs.stat(p)
			return err
		})
		if err != nil {
			return err
		}
		return rp.send(&agent.Frame{Type: agent.FrameResult, File: fi})
	}
}

func fileInfo(p string, st *unix.Stat_t) *agent.FileInfo {
	fi := &agent.FileInfo{
		Path:  p,
		Size:  st.Size,
		Mode:  st.Mode & 0o7777,
		MTime: time.Unix(st.Mtim.Unix()).UTC(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = agent.TypeFile
	case unix.S_IFDIR:
		fi.Type = agent.TypeDir
	case unix.S_IFLNK:
		fi.Type = agent.TypeSymlink
	default:
		fi.Type = agent.TypeOther
	}
	return fi
}

func (fs *fileService) stat(p string) (*agent.FileInfo, error) {
	fd, err := fs.open(p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errnoError(p, err)
	}
	return fileInfo(p, &st), nil
}

func (fs *fileService) read(p string, offset, limit int64, rp *reply) error {
	if offset < 0 {
		return agent.Errorf(errdefs.InvalidArgument, "negative offset")
	}
	if limit <= 0 {
		limit = agent.DefaultReadFileMax
	}
	limit = min(limit, agent.MaxTransferBytes)
	// O_NONBLOCK: opening a FIFO must not hang; it is refused below.
	fd, err := fs.openAsUser(p, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errnoError(p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return agent.Errorf(errdefs.InvalidArgument, "%s is not a regular file", p)
	}
	n := max(0, min(limit, st.Size-offset))
	hdr := &agent.Frame{Type: agent.FrameResult, Len: n, Data: &agent.FileData{Path: p, Size: st.Size, Truncated: offset+n < st.Size}}
	hdr.V = agent.ProtocolVersion
	_ = rp.c.SetWriteDeadline(time.Now().Add(transferTimeout))
	if err := agent.WriteHeader(rp.w, hdr); err != nil {
		return err
	}
	// Streamed rather than buffered: the agent's memory is the sandbox's.
	if _, err := io.CopyN(rp.w, io.NewSectionReader(f, offset, n), n); err != nil {
		return fmt.Errorf("%w: %s shrank while being read: %w", errAbort, p, err)
	}
	return rp.w.Flush()
}

// checkMutable refuses modifications of the root, of kernel filesystems
// and of the agent's socket directory, by path.
func (fs *fileService) checkMutable(p string) error {
	if p == "/" {
		return agent.Errorf(errdefs.InvalidArgument, "refusing to modify /")
	}
	for _, pre := range []string{"/proc", "/sys", "/dev", fs.sockDir} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return agent.Errorf(errdefs.InvalidArgument, "refusing to modify %s (under %s)", p, pre)
		}
	}
	return nil
}

// checkDir refuses a resolved parent directory that symlinks led to a
// kernel filesystem or to the socket directory.
func (fs *fileService) checkDir(p string, dirfd int) error {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(dirfd, &sfs); err != nil {
		return errnoError(p, err)
	}
	switch sfs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.DEVPTS_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return agent.Errorf(errdefs.InvalidArgument, "refusing to modify %s: kernel filesystem", p)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil {
		return errnoError(p, err)
	}
	if fs.sockStat != nil && st.Dev == fs.sockStat.Dev && st.Ino == fs.sockStat.Ino {
		return agent.Errorf(errdefs.InvalidArgument, "refusing to modify %s: agent socket directory", p)
	}
	return nil
}

// parent resolves and checks the directory containing p.
func (fs *fileService) parent(p string, mkdir bool) (int, error) {
	dir := path.Dir(p)
	var fd int
	var err error
	if mkdir {
		fd, err = fs.mkdirAll(dir)
	} else {
		fd, err = fs.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return -1, err
	}
	if err := fs.checkDir(p, fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// mkdirAll resolves dir, creating missing components owned by the
// sandbox user, and returns an O_PATH descriptor of it. Each component is
// looked up from the root again, so symlinks stay confined.
func (fs *fileService) mkdirAll(dir string) (int, error) {
	fd, err := fs.open("/", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	cur := "/"
	for _, name := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if name == "" {
			continue
		}
		cur = path.Join(cur, name)
		next, err := fs.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if agent.ErrorCode(err) == errdefs.NotFound {
			err = unix.Mkdirat(fd, name, 0o755)
			if err == nil && fs.chown && !fs.dropsCreds() {
				err = unix.Fchownat(fd, name, fs.uid, fs.gid, unix.AT_SYMLINK_NOFOLLOW)
			}
			if err != nil && err != unix.EEXIST {
				unix.Close(fd)
				return -1, errnoError(cur, err)
			}
			next, err = fs.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// write writes a file whole: checked, then replaced atomically.
func (fs *fileService) write(w *agent.WriteFileRequest, payload int64, r *bufio.Reader, rp *reply) error {
	p := w.Path
	switch {
	case w.Size != payload:
		return agent.Errorf(errdefs.InvalidArgument, "size %d does not match payload of %d bytes", w.Size, payload)
	case payload > agent.MaxTransferBytes:
		return agent.Errorf(errdefs.LimitExceeded, "content of %d bytes exceeds %d", payload, agent.MaxTransferBytes)
	case w.Mode&^0o1777 != 0:
		return agent.Errorf(errdefs.InvalidArgument, "mode %o not allowed (no setuid/setgid)", w.Mode)
	}
	if err := fs.checkMutable(p); err != nil {
		return err
	}
	dirfd, err := fs.parent(p, w.MkdirParents)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)

	mode := w.Mode
	if mode == 0 {
		mode = 0o644
	}
	if w.Append {
		return fs.appendTo(dirfd, p, mode, w.Mode != 0, payload, r, rp)
	}
	// A write replaces the file atomically: the content goes to a new file
	// beside it, renamed over the target once complete. A failure (the
	// disk filling up, the client going away) leaves the old file, or
	// none, never a partial one.
	owner, mode, err := fs.replacedOwnerMode(dirfd, p, mode, w.Mode != 0)
	if err != nil {
		return err
	}
	tmp := "." + path.Base(p) + "." + strconv.FormatUint(uint64(time.Now().UnixNano()), 36) + ".sandboxd-tmp"
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return errnoError(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	committed := false
	defer func() {
		if !committed {
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	// With the user's credentials (asUser) the new file is the user's, as
	// if the user had written and renamed it; only a root agent (root
	// mode, or tests) keeps another owner.
	if fs.chown && !fs.dropsCreds() {
		if err := unix.Fchown(fd, owner[0], owner[1]); err != nil {
			return errnoError(p, err)
		}
	}
	// The umask must not decide the mode.
	if err := unix.Fchmod(fd, mode); err != nil {
		return errnoError(p, err)
	}
	if _, err := io.CopyN(f, r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			return agent.Errorf(errdefs.InvalidArgument, "content ended early: %v", err)
		}
		return errnoError(p, err)
	}
	// Data reaches the disk before the name does (ENOSPC shows up here on
	// delayed-allocation filesystems).
	if err := unix.Fsync(fd); err != nil {
		return errnoError(p, err)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, path.Base(p)); err != nil {
		return errnoError(p, err)
	}
	committed = true
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errnoError(p, err)
	}
	return rp.send(&agent.Frame{Type: agent.FrameResult, File: fileInfo(p, &st)})
}

// replacedOwnerMode is the owner and mode of a file a write replaces: an
// existing file keeps its owner, and its mode unless one is asked for
// (setMode); a new one is the sandbox user's. A symlink is refused rather
// than replaced: what the user wanted written is not what a planted link
// would leave there.
func (fs *fileService) replacedOwnerMode(dirfd int, p string, mode uint32, setMode bool) ([2]int, uint32, error) {
	owner := [2]int{fs.uid, fs.gid}
	var old unix.Stat_t
	switch err := unix.Fstatat(dirfd, path.Base(p), &old, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && old.Mode&unix.S_IFMT == unix.S_IFREG:
		owner = [2]int{int(old.Uid), int(old.Gid)}
		if !setMode {
			mode = old.Mode & 0o7777 &^ (unix.S_ISUID | unix.S_ISGID)
		}
	case err == nil:
		return owner, 0, agent.Errorf(errdefs.InvalidArgument, "%s is not a regular file", p)
	case err != unix.ENOENT:
		return owner, 0, errnoError(p, err)
	}
	return owner, mode, nil
}

// appendTo appends to (or creates) p in place: an append is not atomic.
func (fs *fileService) appendTo(dirfd int, p string, mode uint32, setMode bool, payload int64, r *bufio.Reader, rp *reply) error {
	// O_NOFOLLOW: the last component is never followed, so a planted
	// symlink cannot redirect the write. O_NONBLOCK: a FIFO must not hang
	// the open; non-regular files are refused below.
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_APPEND
	created := true
	fd, err := unix.Openat(dirfd, path.Base(p), flags|unix.O_EXCL, mode)
	if err == unix.EEXIST {
		created = false
		fd, err = unix.Openat(dirfd, path.Base(p), flags, 0)
	}
	if err != nil {
		return errnoError(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errnoError(p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return agent.Errorf(errdefs.InvalidArgument, "%s is not a regular file", p)
	}
	if created && fs.chown && !fs.dropsCreds() {
		if err := unix.Fchown(fd, fs.uid, fs.gid); err != nil {
			return errnoError(p, err)
		}
	}
	if created || setMode {
		if err := unix.Fchmod(fd, mode); err != nil {
			return errnoError(p, err)
		}
	}
	if _, err := io.CopyN(f, r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			return agent.Errorf(errdefs.InvalidArgument, "content ended early: %v", err)
		}
		return errnoError(p, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return errnoError(p, err)
	}
	return rp.send(&agent.Frame{Type: agent.FrameResult, File: fileInfo(p, &st)})
}

// listBatch is how many names a listing reads from a directory at a time.
const listBatch = 1024

func (fs *fileService) list(req *agent.Request, r *bufio.Reader, rp *reply) error {
	if req.Max < 0 || req.Max > agent.MaxListEntries {
		return agent.Errorf(errdefs.InvalidArgument, "max: %d is not in 0-%d", req.Max, agent.MaxListEntries)
	}
	l := &lister{rp: rp, recursive: req.Recursive, max: int(req.Max), strict: req.Max == 0}
	if l.strict {
		l.max = agent.MaxListEntries
	}
	// Counting a huge tree sends nothing for a while: a client that has
	// gone (its deadline passed) is noticed by reading, as attach does,
	// and ends the count.
	gone := make(chan struct{})
	_ = rp.c.SetReadDeadline(time.Time{})
	go func() {
		_, _ = r.ReadByte()
		close(gone)
	}()
	l.gone = gone

	p := req.Path
	fd, err := fs.openAsUser(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if agent.ErrorCode(err) == errdefs.InvalidArgument { // not a directory
		fi, serr := fs.stat(p)
		if serr != nil {
			return serr
		}
		if fi.Type != agent.TypeDir {
			if err := l.send(fi); err != nil {
				return err
			}
			return l.end()
		}
	}
	if err != nil {
		return err
	}
	if err := l.walk(fd, p); err != nil {
		return err
	}
	return l.end()
}

// lister sends the first max entries of a listing, in order (sorted by
// name within a directory, a directory's tree right after it), and counts
// the rest without sending them, so that the client learns how long the
// listing is and keeps only what it asked for. The agent's memory is the
// sandbox's: a directory is read in batches of listBatch names, of which
// only those that can still be sent are kept (at most twice the entries
// left to send, plus a batch), so no directory, however large, is held
// whole. The count is exact; it costs a getdents per batch (and an fstatat
// per entry when recursive) and ends when the client goes.
type lister struct {
	rp        *reply
	recursive bool
	// max is the most entries sent. In strict mode (a request without
	// Max) it is MaxListEntries, and a listing longer than that is
	// refused rather than cut.
	max    int
	strict bool
	gone   <-chan struct{}
	// sent and total count the entries sent and all entries seen.
	sent, total int
}

func (l *lister) send(fi *agent.FileInfo) error {
	l.sent++
	l.total++
	return l.rp.send(&agent.Frame{Type: agent.FrameEntry, File: fi})
}

// more counts an entry past max.
func (l *lister) more() error {
	l.total++
	if l.strict {
		return agent.Errorf(errdefs.LimitExceeded, "more than %d entries", l.max)
	}
	return nil
}

// end sends the result: the count, and whether entries were left out.
func (l *lister) end() error {
	return l.rp.send(&agent.Frame{Type: agent.FrameResult, List: &agent.ListResult{Total: l.total, Truncated: l.total > l.sent}})
}

// walk lists the directory fd (which it closes), descending into
// subdirectories when recursive. Subdirectories are opened by single
// component with O_NOFOLLOW, so the walk never leaves the tree through a
// symlink.
func (l *lister) walk(fd int, dir string) error {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	if l.sent >= l.max {
		return l.count(fd, f, dir)
	}
	names, err := l.firstNames(fd, f, dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		p := path.Join(dir, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue // removed since the directory was read
			}
			return errnoError(p, err)
		}
		// An earlier subtree may have used up max: the rest is counted.
		if l.sent < l.max {
			err = l.send(fileInfo(p, &st))
		} else {
			err = l.more()
		}
		if err != nil {
			return err
		}
		if l.recursive && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := l.sub(fd, name, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// sub walks the subdirectory name of fd.
func (l *lister) sub(fd int, name, p string) error {
	sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoError(p, err)
	}
	return l.walk(sub, p)
}

// firstNames reads the directory f (fd) and returns, sorted, its first
// max-sent names: all that can still be sent from it. The names after
// those are counted, with their trees, as they are dropped.
func (l *lister) firstNames(fd int, f *os.File, dir string) ([]string, error) {
	keep := l.max - l.sent
	var names []string
	for {
		if err := l.stopped(dir); err != nil {
			return nil, err
		}
		batch, rerr := f.Readdirnames(listBatch)
		names = append(names, batch...)
		if len(names) > 2*keep || rerr != nil {
			slices.Sort(names)
			if len(names) > keep {
				for _, name := range names[keep:] {
					if err := l.countName(fd, dir, name); err != nil {
						return nil, err
					}
				}
				names = names[:keep]
			}
		}
		if rerr == io.EOF {
			return names, nil
		}
		if rerr != nil {
			return nil, errnoError(dir, rerr)
		}
	}
}

// count counts the entries of the directory f (fd), and of its tree when
// recursive, without sending them.
func (l *lister) count(fd int, f *os.File, dir string) error {
	for {
		if err := l.stopped(dir); err != nil {
			return err
		}
		batch, rerr := f.Readdirnames(listBatch)
		for _, name := range batch {
			if err := l.countName(fd, dir, name); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return errnoError(dir, rerr)
		}
	}
}

// stopped is errAbort once the client has gone.
func (l *lister) stopped(dir string) error {
	select {
	case <-l.gone:
		return fmt.Errorf("%w: client gone while reading %s", errAbort, dir)
	default:
		return nil
	}
}

// countName counts the entry name of the directory fd, one past max, with
// its tree when recursive.
func (l *lister) countName(fd int, dir, name string) error {
	if !l.recursive {
		return l.more()
	}
	p := path.Join(dir, name)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil // removed since the directory was read
		}
		return errnoError(p, err)
	}
	if err := l.more(); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	// Counted, never sent: the names before this one are all the
	// listing can still send.
	sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoError(p, err)
	}
	f := os.NewFile(uintptr(sub), p)
	defer f.Close()
	return l.count(sub, f, p)
}

func (fs *fileService) delete(p string, recursive bool) error {
	if err := fs.checkMutable(p); err != nil {
		return err
	}
	dirfd, err := fs.parent(p, false)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	name := path.Base(p)
	err = unix.Unlinkat(dirfd, name, 0)
	if err == unix.EISDIR {
		if recursive {
			if err := removeContents(dirfd, name, p); err != nil {
				return err
			}
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return errnoError(p, err)
	}
	return nil
}

// removeContents empties the directory name in dirfd, never following
// symlinks.
func removeContents(dirfd int, name, p string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoError(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return errnoError(p, err)
	}
	for _, n := range names {
		child := path.Join(p, n)
		err := unix.Unlinkat(fd, n, 0)
		if err == unix.EISDIR {
			if err := removeContents(fd, n, child); err != nil {
				return err
			}
			err = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
		}
		if err != nil && err != unix.ENOENT {
			return errnoError(child, err)
		}
	}
	return nil
}
