package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pkg/sftp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The sftp subsystem (scp, which speaks SFTP since OpenSSH 9.0, sftp, and
// editors) is github.com/pkg/sftp's request server over the engine's file
// operations: reads in windows of ReadFileRaw, writes spooled and sent with
// one WriteFileFrom when the file is closed (SFTP writes arrive at offsets,
// possibly out of order; the agent's write is a stream), listing and stat
// through the agent, and the operations the agent has no call for (mkdir,
// rename, chmod, times, symlinks) as commands run through Exec, as the
// sandbox's user.

// sftpStart is where relative SFTP paths start, as commands run by default.
const sftpStart = "/workspace"

// readWindow is how much one agent read fetches: SFTP reads are 32 KiB,
// and a round trip per 32 KiB would bound throughput by latency.
const readWindow = 4 << 20

func (s *session) startSFTP() bool {
	if !s.claim() {
		return false
	}
	h := &sftpHandler{c: s.c}
	hs := sftp.Handlers{FileGet: loggedGet{h}, FilePut: loggedPut{h}, FileCmd: loggedCmd{h}, FileList: loggedList{h}}
	go func() {
		// The server closes what it serves when it returns; the channel
		// must stay open for the exit status, which finish sends.
		srv := sftp.NewRequestServer(keepOpen{s.ch}, hs, sftp.WithStartDirectory(sftpStart))
		err := srv.Serve()
		_ = srv.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			s.c.log.Debug("sftp session ended", "err", err)
		}
		s.finish(0, "")
	}()
	return true
}

// keepOpen is the channel without its Close.
type keepOpen struct{ io.ReadWriter }

func (keepOpen) Close() error { return nil }

type sftpHandler struct{ c *conn }

func (h *sftpHandler) id() string { return h.c.login.sandboxID }

// ctx bounds one SFTP operation.
func (h *sftpHandler) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(h.c.ctx, 2*time.Minute)
}

// fsError turns an engine error into what the SFTP server maps to a
// status: not found and permission errors keep their meaning, anything
// else carries its message.
func fsError(err error) error {
	if err == nil {
		return nil
	}
	msg := errdefs.MessageOf(err)
	switch {
	case errdefs.Is(err, errdefs.NotFound) || strings.Contains(msg, "no such file"):
		return &fs.PathError{Op: "sftp", Path: "", Err: fs.ErrNotExist}
	case strings.Contains(msg, "permission denied"):
		return &fs.PathError{Op: "sftp", Path: "", Err: fs.ErrPermission}
	}
	return errors.New(msg)
}

// maxHandles bounds the files one connection holds open through SFTP: each
// costs a read window of memory or a spool file of up to maxSpool bytes.
const maxHandles = 32

// acquire takes a handle slot of the connection, or says why not.
func (h *sftpHandler) acquire() error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.c.handles >= maxHandles {
		return fmt.Errorf("at most %d files open at once per connection", maxHandles)
	}
	h.c.handles++
	return nil
}

func (h *sftpHandler) release() {
	h.c.mu.Lock()
	h.c.handles--
	h.c.mu.Unlock()
}

// Fileread opens a file for reading.
func (h *sftpHandler) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	if err := h.acquire(); err != nil {
		return nil, err
	}
	ra := &readerAt{h: h, path: r.Filepath}
	// Fetch the first window now, so a missing file fails the open.
	if _, err := ra.fill(0); err != nil {
		h.release()
		return nil, err
	}
	return ra, nil
}

type readerAt struct {
	h    *sftpHandler
	path string

	mu     sync.Mutex
	off    int64
	data   []byte
	size   int64
	closed bool
}

// Close drops the window and frees the handle slot.
func (r *readerAt) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed, r.data = true, nil
		r.h.release()
	}
	return nil
}

// fill makes the window hold offset off (the lock held or not yet shared).
func (r *readerAt) fill(off int64) ([]byte, error) {
	if r.data != nil && off >= r.off && off < r.off+int64(len(r.data)) {
		return r.data[off-r.off:], nil
	}
	if r.data != nil && off >= r.size {
		return nil, io.EOF
	}
	ctx, cancel := r.h.ctx()
	defer cancel()
	d, err := r.h.c.s.b.ReadFileRaw(ctx, apitypes.FileReadRequest{SandboxID: r.h.id(), Path: r.path, Offset: off, MaxBytes: readWindow, Encoding: "base64"})
	if err != nil {
		return nil, fsError(err)
	}
	r.off, r.data, r.size = off, d.Data, d.Size
	if d.Data == nil {
		r.data = []byte{}
	}
	if len(d.Data) == 0 {
		return nil, io.EOF
	}
	return r.data, nil
}

func (r *readerAt) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for n < len(p) {
		b, err := r.fill(off + int64(n))
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				return n, io.EOF
			}
			return n, err
		}
		n += copy(p[n:], b)
	}
	return n, nil
}

// Filewrite opens a file for writing: the bytes gather in an unlinked
// temporary file (nothing is left behind if the daemon dies) and go to the
// sandbox in one write when the client closes the file.
func (h *sftpHandler) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	if err := h.acquire(); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "mcp-sandboxd-sftp-")
	if err != nil {
		h.release()
		return nil, fmt.Errorf("spool: %w", err)
	}
	_ = os.Remove(f.Name())
	w := &writerAt{h: h, path: r.Filepath, f: f, appendTo: r.Pflags().Append}
	if !r.Pflags().Trunc && !r.Pflags().Append {
		// An open without truncation keeps what the file holds beyond
		// what is written: start from its bytes.
		if err := w.preload(); err != nil {
			_ = f.Close()
			h.release()
			return nil, err
		}
	}
	return w, nil
}

type writerAt struct {
	h        *sftpHandler
	path     string
	f        *os.File
	appendTo bool

	mu   sync.Mutex
	size int64
	done bool
}

func (w *writerAt) preload() error {
	ctx, cancel := w.h.ctx()
	defer cancel()
	var off int64
	for {
		d, err := w.h.c.s.b.ReadFileRaw(ctx, apitypes.FileReadRequest{SandboxID: w.h.id(), Path: w.path, Offset: off, MaxBytes: readWindow, Encoding: "base64"})
		if err != nil {
			if errdefs.Is(fsError(err), errdefs.NotFound) || errors.Is(fsError(err), fs.ErrNotExist) {
				return nil
			}
			return fsError(err)
		}
		if _, err := w.f.WriteAt(d.Data, off); err != nil {
			return err
		}
		off += int64(len(d.Data))
		w.size = off
		if len(d.Data) == 0 || off >= d.Size {
			return nil
		}
	}
}

// maxSpool bounds one upload as the engine bounds every file write.
const maxSpool = 256 << 20

func (w *writerAt) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > maxSpool {
		return 0, fmt.Errorf("file larger than %d bytes", maxSpool)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.f.WriteAt(p, off)
	if end := off + int64(n); end > w.size {
		w.size = end
	}
	return n, err
}

// Close sends the file to the sandbox.
func (w *writerAt) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
	defer w.h.release()
	defer w.f.Close()
	ctx, cancel := w.h.ctx()
	defer cancel()
	_, err := w.h.c.s.b.WriteFileFrom(ctx, w.h.id(), w.path, "", w.appendTo, w.size, io.NewSectionReader(w.f, 0, w.size))
	if err != nil {
		w.h.c.log.Debug("sftp upload failed", "path", w.path, "size", w.size, "err", err)
	}
	return fsError(err)
}

// run runs a file command as the sandbox's user and turns a failure into
// its message.
func (h *sftpHandler) run(argv ...string) (string, error) {
	ctx, cancel := h.ctx()
	defer cancel()
	res, err := h.c.s.b.Exec(ctx, apitypes.ExecRequest{SandboxID: h.id(), Argv: argv, Cwd: "/"})
	if err != nil {
		return "", fsError(err)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(res.Stderr)
		if strings.Contains(msg, "No such file") {
			return "", &fs.PathError{Op: argv[0], Path: "", Err: fs.ErrNotExist}
		}
		if strings.Contains(msg, "Permission denied") {
			return "", &fs.PathError{Op: argv[0], Path: "", Err: fs.ErrPermission}
		}
		return "", errors.New(msg)
	}
	return res.Stdout, nil
}

// Filecmd runs the commands that change the tree.
func (h *sftpHandler) Filecmd(r *sftp.Request) error {
	switch r.Method {
	case "Setstat":
		return h.setstat(r)
	case "Rename", "PosixRename":
		_, err := h.run("mv", "-f", "-T", "--", r.Filepath, r.Target)
		return err
	case "Rmdir":
		_, err := h.run("rmdir", "--", r.Filepath)
		return err
	case "Mkdir":
		_, err := h.run("mkdir", "--", r.Filepath)
		return err
	case "Link":
		_, err := h.run("ln", "--", r.Filepath, r.Target)
		return err
	case "Symlink":
		// pkg/sftp: Filepath is the link's target, Target the new link.
		_, err := h.run("ln", "-s", "--", r.Filepath, r.Target)
		return err
	case "Remove":
		ctx, cancel := h.ctx()
		defer cancel()
		if fi, err := h.c.s.b.StatFile(ctx, h.id(), r.Filepath); err == nil && fi.Type == "dir" {
			return errors.New("is a directory (use rmdir)")
		}
		_, err := h.c.s.b.DeleteFile(ctx, h.id(), r.Filepath, false)
		return fsError(err)
	}
	return sftp.ErrSSHFxOpUnsupported
}

func (h *sftpHandler) setstat(r *sftp.Request) error {
	flags, attrs := r.AttrFlags(), r.Attributes()
	if flags.Size {
		if _, err := h.run("truncate", "-s", strconv.FormatUint(attrs.Size, 10), "--", r.Filepath); err != nil {
			return err
		}
	}
	if flags.Permissions {
		// Setuid and setgid are dropped: nothing in a sandbox gains
		// privileges (the engine refuses them on writes too).
		mode := attrs.Mode & 0o1777
		if _, err := h.run("chmod", strconv.FormatUint(uint64(mode), 8), "--", r.Filepath); err != nil {
			return err
		}
	}
	if flags.Acmodtime {
		if _, err := h.run("touch", "-m", "-d", "@"+strconv.FormatUint(uint64(attrs.Mtime), 10), "--", r.Filepath); err != nil {
			return err
		}
	}
	// Owners are the sandbox's: a chown from the client is ignored, as
	// an unprivileged sshd user's would fail for anything but itself.
	return nil
}

// Filelist lists, stats and reads links.
func (h *sftpHandler) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	ctx, cancel := h.ctx()
	defer cancel()
	switch r.Method {
	case "List":
		l, err := h.c.s.b.ListFilesPage(ctx, apitypes.FileListRequest{SandboxID: h.id(), Path: r.Filepath, MaxEntries: apitypes.DefaultListEntries})
		if err != nil {
			return nil, fsError(err)
		}
		out := make(lister, 0, len(l.Entries))
		for _, e := range l.Entries {
			out = append(out, fileInfo(e))
		}
		return out, nil
	case "Stat":
		p := r.Filepath
		fi, err := h.c.s.b.StatFile(ctx, h.id(), p)
		if err != nil {
			return nil, fsError(err)
		}
		if fi.Type == "symlink" {
			// SFTP stat follows links; the agent's does not.
			target, err := h.run("readlink", "-e", "--", p)
			if err != nil {
				return nil, err
			}
			if fi, err = h.c.s.b.StatFile(ctx, h.id(), strings.TrimSpace(target)); err != nil {
				return nil, fsError(err)
			}
			fi.Path = p
		}
		return lister{fileInfo(*fi)}, nil
	case "Lstat":
		fi, err := h.c.s.b.StatFile(ctx, h.id(), r.Filepath)
		if err != nil {
			return nil, fsError(err)
		}
		return lister{fileInfo(*fi)}, nil
	case "Readlink":
		target, err := h.run("readlink", "--", r.Filepath)
		if err != nil {
			return nil, err
		}
		return lister{linkTarget{entryInfo{apitypes.FileEntry{Path: strings.TrimSuffix(target, "\n"), Type: "symlink"}}}}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// Lstat answers lstat without following a final link.
func (h *sftpHandler) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	r.Method = "Lstat"
	return h.Filelist(r)
}

type lister []os.FileInfo

func (l lister) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if n < len(out) {
		return n, io.EOF
	}
	return n, nil
}

// entryInfo is an agent file entry as an os.FileInfo.
type entryInfo struct{ e apitypes.FileEntry }

func fileInfo(e apitypes.FileEntry) os.FileInfo { return entryInfo{e} }

func (i entryInfo) Name() string { return path.Base(i.e.Path) }

// linkTarget answers readlink: the request server sends its Name as is.
type linkTarget struct{ entryInfo }

func (l linkTarget) Name() string      { return l.e.Path }
func (i entryInfo) Size() int64        { return i.e.Size }
func (i entryInfo) ModTime() time.Time { return i.e.MTime }
func (i entryInfo) IsDir() bool        { return i.e.Type == "dir" }
func (i entryInfo) Sys() any           { return nil }
func (i entryInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.e.Mode & 0o777)
	if i.e.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if i.e.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if i.e.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch i.e.Type {
	case "dir":
		m |= fs.ModeDir
	case "symlink":
		m |= fs.ModeSymlink
	case "file":
	default:
		m |= fs.ModeIrregular
	}
	return m
}

// The logged* wrappers record each failed SFTP operation (debug level):
// the client sees only a status code and message.
type loggedGet struct{ h *sftpHandler }
type loggedPut struct{ h *sftpHandler }
type loggedCmd struct{ h *sftpHandler }
type loggedList struct{ h *sftpHandler }

func (h *sftpHandler) logged(r *sftp.Request, err error) error {
	if err != nil {
		h.c.log.Debug("sftp operation failed", "method", r.Method, "path", r.Filepath, "err", err)
	}
	return err
}

func (l loggedGet) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	ra, err := l.h.Fileread(r)
	return ra, l.h.logged(r, err)
}

func (l loggedPut) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	w, err := l.h.Filewrite(r)
	return w, l.h.logged(r, err)
}

func (l loggedCmd) Filecmd(r *sftp.Request) error { return l.h.logged(r, l.h.Filecmd(r)) }

func (l loggedList) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	la, err := l.h.Filelist(r)
	return la, l.h.logged(r, err)
}

func (l loggedList) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	la, err := l.h.Lstat(r)
	return la, l.h.logged(r, err)
}
