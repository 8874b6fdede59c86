package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func byteReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// DefaultDialTimeout bounds connecting to the agent.
const DefaultDialTimeout = 5 * time.Second

// Dialer opens a new connection to an agent. Each request uses one
// connection; the transport is the backend's business (a unix socket for a
// container, a virtio-serial or vsock channel for a VM).
type Dialer func(ctx context.Context) (net.Conn, error)

// UnixDialer dials the agent listening on the unix socket at path.
func UnixDialer(path string) Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{Timeout: DefaultDialTimeout}
		nc, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", path, err)
		}
		return nc, nil
	}
}

// Client talks to one sandbox-agent. It keeps no connection between calls,
// so it is safe for concurrent use and survives agent-side connection loss;
// a new Client for the same agent sees the same jobs.
type Client struct {
	dial Dialer
}

// NewClient returns a client that reaches its agent through dial.
func NewClient(dial Dialer) *Client {
	return &Client{dial: dial}
}

// conn is one request's connection.
type conn struct {
	ctx  context.Context
	nc   net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	stop func() bool
	// end ends the request's trace span (SetTracer) with the first
	// error the request met; nil when tracing is off.
	end func(error)
	err error
}

// longAgo is a deadline in the past, used to abort blocked I/O.
var longAgo = time.Unix(1, 0)

// do dials, sends req and its payload of req.Len bytes, and returns the
// connection ready for reading frames. The connection's I/O is aborted when
// ctx is done.
func (c *Client) do(ctx context.Context, req *Request, payload io.Reader) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req.V = ProtocolVersion
	var end func(error)
	if t := tracer.Load(); t != nil {
		ctx, end = (*t)(ctx, req.Op)
	}
	nc, err := c.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("agent: %w: %w", err, ctx.Err())
		} else {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if end != nil {
			end(err)
		}
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	cn := &conn{
		ctx:  ctx,
		nc:   nc,
		r:    bufio.NewReaderSize(nc, 64<<10),
		w:    bufio.NewWriterSize(nc, 64<<10),
		stop: context.AfterFunc(ctx, func() { _ = nc.SetDeadline(longAgo) }),
		end:  end,
	}
	if err := WriteHeader(cn.w, req); err != nil {
		return nil, cn.fail(cn.wrap(err))
	}
	if req.Len > 0 {
		n, err := io.CopyN(cn.w, payload, req.Len)
		if err != nil {
			if err == io.EOF {
				return nil, cn.fail(Errorf(errdefs.InvalidArgument, "payload ended after %d of %d bytes", n, req.Len))
			}
			return nil, cn.fail(cn.wrap(fmt.Errorf("send payload: %w", err)))
		}
	}
	if err := cn.w.Flush(); err != nil {
		return nil, cn.fail(cn.wrap(fmt.Errorf("send request: %w", err)))
	}
	return cn, nil
}

// fail closes the connection of a request that failed with err.
func (cn *conn) fail(err error) error {
	cn.err = err
	cn.close()
	return err
}

func (cn *conn) close() {
	cn.stop()
	_ = cn.nc.Close()
	if cn.end != nil {
		cn.end(cn.err)
		cn.end = nil
	}
}

// Tracer starts the span of one request to an agent (its op: start,
// attach, write_file…) and returns the context under it and the function
// that ends it with the request's error. The daemon sets one
// (pkg/telemetry) when it exports traces; the agent binary, which shares
// this package, never links the exporter.
type Tracer func(ctx context.Context, op string) (context.Context, func(error))

var tracer atomic.Pointer[Tracer]

// SetTracer sets (nil: clears) the tracer of every Client.
func SetTracer(t Tracer) {
	if t == nil {
		tracer.Store(nil)
		return
	}
	tracer.Store(&t)
}

// wrap prefers the context's error over the I/O error it caused.
func (cn *conn) wrap(err error) error {
	if err == nil {
		return nil
	}
	if cerr := cn.ctx.Err(); cerr != nil {
		return fmt.Errorf("agent: %w (%v)", cerr, err)
	}
	var aerr *Error
	if errors.As(err, &aerr) || errors.Is(err, ErrProtocol) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: connection closed by agent: %w", ErrUnavailable, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("agent: %w", context.DeadlineExceeded)
	}
	return fmt.Errorf("agent: %w", err)
}

// frame reads the next frame. An error frame is returned as its *Error.
func (cn *conn) frame(maxLen int64) (f *Frame, err error) {
	defer func() {
		if err != nil && cn.err == nil {
			cn.err = err
		}
	}()
	f, err = ReadFrame(cn.r, maxLen)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, cn.wrap(err)
	}
	if f.Type == FrameError {
		if f.Error == nil || !errdefs.Known(f.Error.Code) {
			return nil, fmt.Errorf("%w: malformed error frame", ErrProtocol)
		}
		if len(f.Error.Message) > 4096 {
			f.Error.Message = f.Error.Message[:4096]
		}
		return nil, f.Error
	}
	return f, nil
}

// expect reads the next frame and checks its type.
func (cn *conn) expect(typ string, maxLen int64) (*Frame, error) {
	f, err := cn.frame(maxLen)
	if err != nil {
		return nil, err
	}
	if f.Type != typ {
		return nil, fmt.Errorf("%w: got %q frame, want %q", ErrProtocol, f.Type, typ)
	}
	return f, nil
}

// payload reads the n payload bytes announced by a frame.
func (cn *conn) payload(n int64) ([]byte, error) {
	buf := make([]byte, n)
	if _, err := io.ReadFull(cn.r, buf); err != nil {
		return nil, cn.wrap(fmt.Errorf("read payload: %w", err))
	}
	return buf, nil
}

// call performs a request whose answer is a single result frame without
// payload.
func (c *Client) call(ctx context.Context, req *Request) (*Frame, error) {
	cn, err := c.do(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	return cn.expect(FrameResult, 0)
}

// Ping returns information about the agent.
func (c *Client) Ping(ctx context.Context) (*Info, error) {
	f, err := c.call(ctx, &Request{Op: OpPing})
	if err != nil {
		return nil, err
	}
	if f.Info == nil || f.Info.PID <= 0 {
		return nil, fmt.Errorf("%w: ping result without info", ErrProtocol)
	}
	return f.Info, nil
}

// Start starts a job and returns its id without waiting for it.
func (c *Client) Start(ctx context.Context, req ExecRequest) (string, error) {
	if len(req.Argv) == 0 {
		return "", Errorf(errdefs.InvalidArgument, "empty argv")
	}
	if len(req.Stdin) > MaxStdinBytes {
		return "", Errorf(errdefs.LimitExceeded, "stdin of %d bytes exceeds %d", len(req.Stdin), MaxStdinBytes)
	}
	cn, err := c.do(ctx, &Request{Op: OpStart, Exec: &req, Len: int64(len(req.Stdin))}, byteReader(req.Stdin))
	if err != nil {
		return "", err
	}
	defer cn.close()
	f, err := cn.expect(FrameResult, 0)
	if err != nil {
		return "", err
	}
	if err := ValidateJobID(f.JobID); err != nil {
		return "", fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return f.JobID, nil
}

// Attach streams a job's output from the given offsets to onChunk and
// returns the job's exit status once it has finished. It works for running
// and finished jobs; several attachers may follow one job. If onChunk
// returns an error, Attach stops and returns it. Attach blocks until the job
// ends or ctx is done.
func (c *Client) Attach(ctx context.Context, jobID string, stdoutOff, stderrOff int64, onChunk func(Chunk) error) (*ExitStatus, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	if stdoutOff < 0 || stderrOff < 0 {
		return nil, Errorf(errdefs.InvalidArgument, "negative offset")
	}
	cn, err := c.do(ctx, &Request{Op: OpAttach, JobID: jobID, StdoutOffset: stdoutOff, StderrOffset: stderrOff}, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	return cn.follow(stdoutOff, stderrOff, onChunk)
}

// Run starts a command as Start does and follows it on the same
// connection as Attach from offset 0 does: onStarted gets the job's id as
// soon as the agent has started it, onChunk its output, and the result is
// its exit status. The agent forgets the job once it has sent that, as
// Forget would, before Run returns. One connection instead of three: each is a connect, an
// accept and a wake-up of both processes. An error before onStarted ran
// means no job was started; after, the job may still be running.
//
// An agent that predates Request.Follow answers the start alone and closes
// the connection; Run then attaches and forgets on connections of their
// own, as a daemon did before.
func (c *Client) Run(ctx context.Context, req ExecRequest, onStarted func(jobID string), onChunk func(Chunk) error) (*ExitStatus, error) {
	if len(req.Argv) == 0 {
		return nil, Errorf(errdefs.InvalidArgument, "empty argv")
	}
	if len(req.Stdin) > MaxStdinBytes {
		return nil, Errorf(errdefs.LimitExceeded, "stdin of %d bytes exceeds %d", len(req.Stdin), MaxStdinBytes)
	}
	cn, err := c.do(ctx, &Request{Op: OpStart, Exec: &req, Len: int64(len(req.Stdin)), Follow: true}, byteReader(req.Stdin))
	if err != nil {
		return nil, err
	}
	f, err := cn.expect(FrameResult, 0)
	if err == nil {
		if verr := ValidateJobID(f.JobID); verr != nil {
			err = fmt.Errorf("%w: %v", ErrProtocol, verr)
			cn.err = err
		}
	}
	if err != nil {
		cn.close()
		return nil, err
	}
	onStarted(f.JobID)
	if _, err := cn.r.Peek(1); errors.Is(err, io.EOF) {
		// An agent without Follow: closed cleanly after the result.
		cn.close()
		exit, err := c.Attach(ctx, f.JobID, 0, 0, onChunk)
		if err != nil {
			return nil, err
		}
		// As a daemon forgot a delivered job: briefly, even if the caller
		// has just gone.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = c.Forget(fctx, f.JobID)
		cancel()
		return exit, nil
	}
	defer cn.close()
	exit, err := cn.follow(0, 0, onChunk)
	if err == nil {
		// The agent forgets the job, then closes: once Run returns, the
		// job is gone from its table, as after a Forget.
		_, _ = cn.r.ReadByte()
	}
	return exit, err
}

// follow reads an attach's output frames from the given offsets, handing
// each chunk to onChunk, until the exit frame.
func (cn *conn) follow(stdoutOff, stderrOff int64, onChunk func(Chunk) error) (*ExitStatus, error) {
	next := map[string]int64{StreamStdout: stdoutOff, StreamStderr: stderrOff}
	for {
		f, err := cn.frame(MaxChunkBytes)
		if err != nil {
			return nil, err
		}
		switch f.Type {
		case FrameOutput:
			ch, err := cn.chunk(f, next)
			if err != nil {
				return nil, err
			}
			if err := onChunk(ch); err != nil {
				return nil, err
			}
		case FrameExit:
			if err := validateExit(f.Exit); err != nil {
				return nil, err
			}
			return f.Exit, nil
		default:
			return nil, fmt.Errorf("%w: unexpected %q frame in attach", ErrProtocol, f.Type)
		}
	}
}

// chunk reads and validates an output frame's payload; next holds the
// expected offset per stream, which the agent may only move forward.
func (cn *conn) chunk(f *Frame, next map[string]int64) (Chunk, error) {
	want, ok := next[f.Stream]
	if !ok {
		return Chunk{}, fmt.Errorf("%w: unknown stream %q", ErrProtocol, f.Stream)
	}
	if f.Offset < want {
		return Chunk{}, fmt.Errorf("%w: %s offset went back from %d to %d", ErrProtocol, f.Stream, want, f.Offset)
	}
	data, err := cn.payload(f.Len)
	if err != nil {
		return Chunk{}, err
	}
	next[f.Stream] = f.Offset + f.Len
	return Chunk{Stream: f.Stream, Offset: f.Offset, Data: data}, nil
}

var knownCauses = map[string]bool{
	CauseExited: true, CauseSignal: true, CauseTimeout: true, CauseOutputLimit: true, CauseKilled: true,
}

func validateExit(e *ExitStatus) error {
	if e == nil || !knownCauses[e.Cause] || e.ExitCode < 0 || e.ExitCode > 255 ||
		len(e.Signal) > 32 || len(e.Detail) > 4096 || e.StdoutBytes < 0 || e.StderrBytes < 0 {
		return fmt.Errorf("%w: invalid exit status", ErrProtocol)
	}
	return nil
}

// Read returns, without blocking, up to max bytes per stream of a job's
// output after the given offsets, plus its exit status if it has finished.
// A max of zero or more than MaxReadBytes means MaxReadBytes.
func (c *Client) Read(ctx context.Context, jobID string, stdoutOff, stderrOff int64, max int) (*ReadResult, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	if stdoutOff < 0 || stderrOff < 0 {
		return nil, Errorf(errdefs.InvalidArgument, "negative offset")
	}
	if max <= 0 || max > MaxReadBytes {
		max = MaxReadBytes
	}
	cn, err := c.do(ctx, &Request{Op: OpRead, JobID: jobID, StdoutOffset: stdoutOff, StderrOffset: stderrOff, Max: int64(max)}, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	f, err := cn.expect(FrameResult, 2*int64(max))
	if err != nil {
		return nil, err
	}
	r := f.Read
	if r == nil || r.StdoutLen < 0 || r.StderrLen < 0 || r.StdoutLen > max || r.StderrLen > max ||
		int64(r.StdoutLen+r.StderrLen) != f.Len ||
		r.StdoutOffset < stdoutOff || r.StderrOffset < stderrOff ||
		r.NextStdoutOffset != r.StdoutOffset+int64(r.StdoutLen) ||
		r.NextStderrOffset != r.StderrOffset+int64(r.StderrLen) {
		return nil, fmt.Errorf("%w: invalid read result", ErrProtocol)
	}
	switch r.State {
	case StateRunning:
		r.Exit = nil
	case StateFinished:
		if err := validateExit(r.Exit); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: invalid job state %q", ErrProtocol, r.State)
	}
	data, err := cn.payload(f.Len)
	if err != nil {
		return nil, err
	}
	r.Stdout, r.Stderr = data[:r.StdoutLen:r.StdoutLen], data[r.StdoutLen:]
	return r, nil
}

// Signal sends a signal, by name ("SIGTERM", "TERM") or number ("15"), to
// the job's process group. SIGKILL finishes the job with cause "killed".
func (c *Client) Signal(ctx context.Context, jobID string, sig string) error {
	if err := ValidateJobID(jobID); err != nil {
		return err
	}
	_, err := c.call(ctx, &Request{Op: OpSignal, JobID: jobID, Signal: sig})
	return err
}

// Jobs lists the running and retained finished jobs.
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, error) {
	cn, err := c.do(ctx, &Request{Op: OpJobs}, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	var jobs []JobInfo
	for {
		f, err := cn.frame(0)
		if err != nil {
			return nil, err
		}
		switch {
		case f.Type == FrameResult:
			return jobs, nil
		case f.Type == FrameEntry && f.Job != nil && ValidateJobID(f.Job.ID) == nil && len(jobs) < MaxListEntries:
			jobs = append(jobs, *f.Job)
		default:
			return nil, fmt.Errorf("%w: invalid job entry", ErrProtocol)
		}
	}
}

// Forget drops a finished job from the agent.
func (c *Client) Forget(ctx context.Context, jobID string) error {
	if err := ValidateJobID(jobID); err != nil {
		return err
	}
	_, err := c.call(ctx, &Request{Op: OpForget, JobID: jobID})
	return err
}

// ReadFile reads up to max bytes of the file at path from offset. A max of
// zero or less means DefaultReadFileMax; at most MaxTransferBytes are read.
func (c *Client) ReadFile(ctx context.Context, path string, offset, max int64) (*FileData, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, Errorf(errdefs.InvalidArgument, "negative offset")
	}
	if max <= 0 {
		max = DefaultReadFileMax
	}
	max = min(max, MaxTransferBytes)
	cn, err := c.do(ctx, &Request{Op: OpReadFile, Path: path, Offset: offset, Max: max}, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	f, err := cn.expect(FrameResult, max)
	if err != nil {
		return nil, err
	}
	if f.Data == nil || f.Data.Size < 0 {
		return nil, fmt.Errorf("%w: invalid file data", ErrProtocol)
	}
	fd := f.Data
	if fd.Data, err = cn.payload(f.Len); err != nil {
		return nil, err
	}
	fd.Path = path
	return fd, nil
}

// WriteFile writes content to the file described by req. When req.Size is
// zero and content's length cannot be learnt (it has no Len method), the
// content is buffered in memory up to MaxTransferBytes.
func (c *Client) WriteFile(ctx context.Context, req WriteFileRequest, content io.Reader) (*FileInfo, error) {
	if err := ValidatePath(req.Path); err != nil {
		return nil, err
	}
	if content == nil {
		content = byteReader(nil)
	}
	if req.Size == 0 {
		if l, ok := content.(interface{ Len() int }); ok {
			req.Size = int64(l.Len())
		} else {
			b, err := io.ReadAll(io.LimitReader(content, MaxTransferBytes+1))
			if err != nil {
				return nil, fmt.Errorf("agent: read content: %w", err)
			}
			req.Size, content = int64(len(b)), byteReader(b)
		}
	}
	if req.Size < 0 || req.Size > MaxTransferBytes {
		return nil, Errorf(errdefs.LimitExceeded, "content of %d bytes exceeds %d", req.Size, MaxTransferBytes)
	}
	cn, err := c.do(ctx, &Request{Op: OpWriteFile, Write: &req, Len: req.Size}, content)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	f, err := cn.expect(FrameResult, 0)
	if err != nil {
		return nil, err
	}
	if err := validateFileInfo(f.File); err != nil {
		return nil, err
	}
	return f.File, nil
}

func validateFileInfo(fi *FileInfo) error {
	if fi == nil || ValidatePath(fi.Path) != nil || fi.Size < 0 {
		return fmt.Errorf("%w: invalid file info", ErrProtocol)
	}
	switch fi.Type {
	case TypeFile, TypeDir, TypeSymlink, TypeOther:
		return nil
	}
	return fmt.Errorf("%w: invalid file type %q", ErrProtocol, fi.Type)
}

// ListFiles lists the directory at path (recursively if asked). Listing a
// file returns just that file. A listing of more than MaxListEntries
// entries is refused with limit_exceeded: the caller gets every entry or
// none.
func (c *Client) ListFiles(ctx context.Context, path string, recursive bool) ([]FileInfo, error) {
	l, err := c.listFiles(ctx, path, recursive, 0)
	if err != nil {
		return nil, err
	}
	return l.Entries, nil
}

// ListFilesMax lists the directory at path (recursively if asked) up to
// max entries (1 to MaxListEntries), with how many entries it has: the
// agent counts those it does not send, and the client keeps no more than
// max whatever the agent sends. An agent that predates counted listings
// (a sandbox started before the upgrade) sends every entry: those past
// max are counted here, and past MaxListEntries it refuses the listing
// with limit_exceeded, as it always did.
func (c *Client) ListFilesMax(ctx context.Context, path string, recursive bool, max int) (*FileList, error) {
	if max < 1 || max > MaxListEntries {
		return nil, Errorf(errdefs.InvalidArgument, "max: %d is not in 1-%d", max, MaxListEntries)
	}
	return c.listFiles(ctx, path, recursive, max)
}

// listFiles is a list_files request with Max set to max; 0 asks for the
// whole listing (kept up to MaxListEntries, past which the agent refuses).
func (c *Client) listFiles(ctx context.Context, path string, recursive bool, max int) (*FileList, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	cn, err := c.do(ctx, &Request{Op: OpListFiles, Path: path, Recursive: recursive, Max: int64(max)}, nil)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	keep := max
	if keep == 0 {
		keep = MaxListEntries
	}
	out := &FileList{}
	n := 0 // entries received
	for {
		f, err := cn.frame(0)
		if err != nil {
			return nil, err
		}
		if f.Type == FrameResult {
			return out, listResult(out, f.List, n, max)
		}
		// No agent sends more than MaxListEntries, counted or not.
		if f.Type != FrameEntry || n >= MaxListEntries {
			return nil, fmt.Errorf("%w: invalid listing entry", ErrProtocol)
		}
		if err := validateFileInfo(f.File); err != nil {
			return nil, err
		}
		if n++; len(out.Entries) < keep {
			out.Entries = append(out.Entries, *f.File)
		}
	}
}

// listResult completes out, a listing of n received entries asked with
// max, from the agent's result (nil from an agent that predates counted
// listings, which sends every entry it lists).
func listResult(out *FileList, lr *ListResult, n, max int) error {
	if lr == nil {
		out.Total, out.Truncated = n, n > len(out.Entries)
		return nil
	}
	switch {
	case n > len(out.Entries), lr.Total < n, lr.Truncated != (lr.Total > n):
		return fmt.Errorf("%w: listing of %d entries says total %d, truncated %v (max %d)", ErrProtocol, n, lr.Total, lr.Truncated, max)
	case max == 0 && lr.Truncated:
		return Errorf(errdefs.LimitExceeded, "more than %d entries", MaxListEntries)
	}
	out.Total, out.Truncated = lr.Total, lr.Truncated
	return nil
}

// DeleteFile removes the file or directory at path; a non-empty directory
// needs recursive.
func (c *Client) DeleteFile(ctx context.Context, path string, recursive bool) error {
	if err := ValidatePath(path); err != nil {
		return err
	}
	_, err := c.call(ctx, &Request{Op: OpDeleteFile, Path: path, Recursive: recursive})
	return err
}

// Stat describes the file at path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (*FileInfo, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	f, err := c.call(ctx, &Request{Op: OpStat, Path: path})
	if err != nil {
		return nil, err
	}
	if err := validateFileInfo(f.File); err != nil {
		return nil, err
	}
	return f.File, nil
}
