package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/filesystem"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// The file operations the agent has no op for (stat with owners, mkdir,
// rename, listing to a depth) run as short commands in the sandbox, as the
// requesting user: GNU find prints entries in entryFormat, NUL-terminated.
const entryFormat = `%y\t%s\t%m\t%u\t%g\t%T@\t%l\t%p\0`

// Exit codes of the scripts below, mapped to envd's errors.
const (
	exitNotFound      = 2
	exitNotDir        = 3
	exitAlreadyExists = 17
	exitIsFile        = 18
)

// scripts: $1 (and $2) are paths, never interpolated into the script.
const (
	statScript = `[ -e "$1" ] || [ -L "$1" ] || { echo "$1: no such file or directory" >&2; exit 2; }
exec find -P "$1" -maxdepth 0 -printf '` + entryFormat + `'`
	listScript = `[ -e "$1" ] || { echo "$1: no such file or directory" >&2; exit 2; }
[ -d "$1" ] || { echo "$1: not a directory" >&2; exit 3; }
exec find -P "$1" -mindepth 1 -maxdepth "$2" -printf '` + entryFormat + `'`
	mkdirScript = `if [ -d "$1" ]; then exit 17; fi
if [ -e "$1" ]; then echo "$1: exists and is not a directory" >&2; exit 18; fi
mkdir -p -- "$1" || exit 1
exec find -P "$1" -maxdepth 0 -printf '` + entryFormat + `'`
	moveScript = `[ -e "$1" ] || [ -L "$1" ] || { echo "$1: no such file or directory" >&2; exit 2; }
mkdir -p -- "$(dirname -- "$2")" && mv -fT -- "$1" "$2" || exit 1
exec find -P "$2" -maxdepth 0 -printf '` + entryFormat + `'`
	removeScript = `exec rm -rf -- "$1"`
)

// fsTimeout bounds one file operation's command.
const fsTimeout = 60 * time.Second

// run runs a script as user and returns its stdout; a failure becomes the
// envd error its exit code stands for.
func (s *Server) run(ctx context.Context, c *envdCall, user, script string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, fsTimeout)
	defer cancel()
	p, err := s.b.OpenProcess(ctx, apitypes.ProcessRequest{SandboxID: c.sb.ID, Argv: append([]string{"/bin/sh", "-c", script, "sh"}, args...),
		Env: map[string]string{"HOME": home(user), "LC_ALL": "C"}, Cwd: "/", Root: user == userRoot, TimeoutSeconds: fsTimeout.Seconds()})
	if err != nil {
		return nil, err
	}
	_ = p.CloseStdin()
	var out, errOut []byte
	for ch := range p.Chunks() {
		if ch.Stream == "stderr" {
			errOut = append(errOut, ch.Data...)
		} else {
			out = append(out, ch.Data...)
		}
	}
	res, err := p.Wait()
	if err != nil {
		return nil, err
	}
	msg := strings.TrimSpace(string(errOut))
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:]
	}
	switch {
	case res.Termination.Cause != apitypes.CauseExited:
		return nil, errdefs.Unavailablef("file operation did not finish: %s", res.Termination.Cause)
	case res.ExitCode == 0:
		return out, nil
	case res.ExitCode == exitNotFound || strings.Contains(msg, "No such file"):
		return nil, connect.NewError(connect.CodeNotFound, errors.New(msg))
	case res.ExitCode == exitNotDir || res.ExitCode == exitIsFile || strings.Contains(msg, "Not a directory"):
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(msg))
	case res.ExitCode == exitAlreadyExists:
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory already exists"))
	case strings.Contains(msg, "Permission denied"):
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New(msg))
	}
	return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("file operation failed: %s", msg))
}

// parseEntries reads find's entryFormat records.
func parseEntries(out []byte) ([]*filesystem.EntryInfo, error) {
	var entries []*filesystem.EntryInfo
	for _, rec := range strings.Split(string(out), "\x00") {
		if rec == "" {
			continue
		}
		f := strings.SplitN(rec, "\t", 8)
		if len(f) != 8 {
			return nil, errdefs.New(errdefs.Internal, "unreadable file entry")
		}
		size, _ := strconv.ParseInt(f[1], 10, 64)
		perm, _ := strconv.ParseUint(f[2], 8, 32)
		secs, _ := strconv.ParseFloat(f[5], 64)
		mode := fs.FileMode(perm & 0o777)
		if perm&0o4000 != 0 {
			mode |= fs.ModeSetuid
		}
		if perm&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if perm&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		e := &filesystem.EntryInfo{Name: path.Base(f[7]), Path: f[7], Size: size, Owner: f[3], Group: f[4],
			ModifiedTime: timestamppb.New(time.Unix(0, int64(secs*1e9)))}
		switch f[0] {
		case "d":
			e.Type, mode = filesystem.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
		case "l":
			e.Type, mode = filesystem.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
			target := f[6]
			e.SymlinkTarget = &target
		default:
			e.Type = filesystem.FileType_FILE_TYPE_FILE
		}
		e.Mode, e.Permissions = uint32(mode), mode.String()
		entries = append(entries, e)
	}
	return entries, nil
}

func (s *Server) entry(ctx context.Context, c *envdCall, script string, args ...string) (*filesystem.EntryInfo, error) {
	out, err := s.run(ctx, c, c.user, script, args...)
	if err != nil {
		return nil, connectErr(err)
	}
	es, err := parseEntries(out)
	if err != nil || len(es) != 1 {
		return nil, connect.NewError(connect.CodeInternal, errors.New("file operation gave no entry"))
	}
	return es[0], nil
}

// filesystemService is envd's filesystem.Filesystem.
type filesystemService struct{ s *Server }

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	c := callOf(ctx)
	p, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	e, err := f.s.entry(ctx, c, statScript, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	c := callOf(ctx)
	p, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	e, err := f.s.entry(ctx, c, mkdirScript, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	c := callOf(ctx)
	src, err := resolve(c.user, req.Msg.GetSource())
	if err != nil {
		return nil, connectErr(errdefs.Invalidf("source: %s", errdefs.MessageOf(err)))
	}
	dst, err := resolve(c.user, req.Msg.GetDestination())
	if err != nil {
		return nil, connectErr(errdefs.Invalidf("destination: %s", errdefs.MessageOf(err)))
	}
	e, err := f.s.entry(ctx, c, moveScript, src, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// maxDepth bounds ListDir's depth (envd has no bound; a deep tree is a
// large answer).
const maxDepth = 64

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	c := callOf(ctx)
	p, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	depth := max(req.Msg.GetDepth(), 1)
	if depth > maxDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth: %d exceeds %d", depth, maxDepth))
	}
	out, err := f.s.run(ctx, c, c.user, listScript, p, strconv.Itoa(int(depth)))
	if err != nil {
		return nil, connectErr(err)
	}
	es, err := parseEntries(out)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: es}), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	c := callOf(ctx)
	p, err := resolve(c.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path: refusing to remove /"))
	}
	if _, err := f.s.run(ctx, c, c.user, removeScript, p); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
