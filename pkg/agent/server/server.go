package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
)

const (
	// requestTimeout bounds receiving a request header and small payloads.
	requestTimeout = 30 * time.Second
	// transferTimeout bounds receiving a file's content.
	transferTimeout = 10 * time.Minute
	// writeTimeout bounds sending one frame: a client that stops reading
	// must not pin a goroutine forever.
	writeTimeout = 30 * time.Second
)

// Server serves the agent protocol: jobs, files and terminals of one
// sandbox, over any stream connection (a unix socket in a container, a
// virtio-serial port or vsock in a VM). Each connection carries exactly one
// request.
type Server struct {
	log     *slog.Logger
	reaper  *reaper
	jobs    *jobTable
	files   *fileService
	started time.Time
	cancel  context.CancelFunc
	trim    *time.Timer // returns the heap to the kernel once requests stop
	// trimmedAt is the heap's allocation count (bytes) at the last trim.
	trimmedAt atomic.Uint64
}

// idleTrimDelay is how long the agent waits after its last request before
// it collects and returns its free heap to the kernel. Output a job
// retained, buffers of finished connections: garbage the collector would
// otherwise keep until the heap reached its goal (4 MiB at least), for as
// long as the sandbox sits idle — 7.3 MiB charged per idle sandbox after 20
// commands of 100 KiB output each, against 1.9 fresh
// (BenchmarkIdleMemory, docs/ARCHITECTURE.md). One collection of a heap of
// a few hundred KiB live, once per quiet spell, and only when the requests
// since the last allocated trimMinAlloc: collecting the small heap of an
// agent that only answered the daemon's first requests costs more (the
// collector's workers: +0.2 MiB per fresh sandbox) than it returns.
const (
	idleTrimDelay = time.Second
	trimMinAlloc  = 1 << 20
)

// heapAllocated is the heap's cumulative allocation count in bytes.
func heapAllocated() uint64 {
	m := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return m[0].Value.Uint64()
}

// armTrim schedules a trim if the heap has allocated enough since the last.
func (s *Server) armTrim() {
	if heapAllocated()-s.trimmedAt.Load() >= trimMinAlloc {
		s.trim.Reset(idleTrimDelay)
	}
}

// trimHeap collects and returns the free heap to the kernel.
func (s *Server) trimHeap() {
	debug.FreeOSMemory()
	s.trimmedAt.Store(heapAllocated())
}

// Options configure a Server.
type Options struct {
	// Root is the directory file operations are confined to ("/").
	Root string
	// PrivateDir is a directory only the agent may use (its socket's
	// directory in a container); file operations refuse it.
	PrivateDir string
	// UID and GID are the default identity of commands and the owner of
	// written files.
	UID, GID int
	// RootMode (a root-mode sandbox, inside its own user namespace) lets
	// jobs asked to run as uid 0 keep the capability bounding set even when
	// UID is not 0. Without it only an agent whose default user is 0 does.
	RootMode bool
	// RetainBytes is the output retained per stream of each job.
	RetainBytes int
	// MaxFinished is how many finished jobs are kept before the oldest go.
	MaxFinished int
	// Cgroups is where the sandbox's delegated cgroups are mounted (see
	// jobcgroup.go); each job then runs in its own child cgroup. Empty: jobs
	// share the agent's cgroup and kills sweep their session only.
	Cgroups string
	// JobsPids is the most tasks the jobs may have together (see
	// jobcgroup.go), below the sandbox's pids.max by agent.PidsReserve;
	// 0: no limit of the jobs' own. Used only with Cgroups.
	JobsPids int64
}

// New returns a Server and starts its reaper. Call it before any child
// process exists so that no exit is missed, and Close it to stop.
func New(log *slog.Logger, o Options) (*Server, error) {
	switch {
	case o.UID < 0 || o.GID < 0:
		return nil, errors.New("uid and gid must not be negative")
	case o.RetainBytes < 4096:
		return nil, errors.New("retain bytes must be at least 4096")
	case o.MaxFinished < 1:
		return nil, errors.New("max finished jobs must be at least 1")
	}
	r, err := newReaper(log)
	if err != nil {
		return nil, err
	}
	files, err := newFileService(o.Root, o.PrivateDir, o.UID, o.GID)
	if err != nil {
		return nil, err
	}
	cgs, err := newJobCgroups(o.Cgroups, o.JobsPids)
	if err != nil {
		return nil, err
	}
	jobs := newJobTable(log, r, &o)
	jobs.cgroups = cgs
	if cgs != nil {
		if jobs.self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the agent's executable: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	jobs.prepareSpare() // the first command need not wait for a cgroup move
	srv := &Server{log: log, reaper: r, jobs: jobs, files: files, started: time.Now(), cancel: cancel}
	srv.trim = time.AfterFunc(time.Hour, srv.trimHeap)
	srv.trim.Stop() // armed by the end of requests (armTrim)
	srv.trimmedAt.Store(heapAllocated())
	return srv, nil
}

// KillAll kills every job (the sandbox is shutting down).
func (s *Server) KillAll() { s.jobs.killAll() }

// Close releases the file service and stops the reaper.
func (s *Server) Close() {
	s.cancel()
	s.files.close()
}

// Serve accepts connections until ln is closed and serves each one's
// request.
func (s *Server) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors or memory: as PID 1 the agent must not
			// exit (that would kill the sandbox), so back off and retry.
			s.log.Error("accept failed", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go s.ServeConn(c)
	}
}

// reply writes frames to one connection.
type reply struct {
	c net.Conn
	w *bufio.Writer
}

// send writes a frame and its payload and flushes.
func (rp *reply) send(f *agent.Frame, payloads ...[]byte) error {
	f.V = agent.ProtocolVersion
	f.Len = 0
	for _, p := range payloads {
		f.Len += int64(len(p))
	}
	_ = rp.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := agent.WriteHeader(rp.w, f); err != nil {
		return err
	}
	for _, p := range payloads {
		if _, err := rp.w.Write(p); err != nil {
			return err
		}
	}
	return rp.w.Flush()
}

// ServeConn serves the one request that connection c carries, then closes
// it.
func (s *Server) ServeConn(c net.Conn) {
	defer s.armTrim()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(requestTimeout))
	r := bufio.NewReaderSize(c, 64<<10)
	rp := &reply{c: c, w: bufio.NewWriterSize(c, 64<<10)}
	op := ""
	req, err := readRequest(r)
	if err == nil {
		op = req.Op
		err = s.dispatch(req, c, r, rp)
	}
	if err == nil {
		return
	}
	if errors.Is(err, errAbort) {
		s.log.Debug("response aborted", "op", op, "err", err)
		return
	}
	var aerr *agent.Error
	if !errors.As(err, &aerr) {
		s.log.Error("request failed", "op", op, "err", err)
		aerr = agent.Errorf(errdefs.Internal, "%v", err)
	}
	if err := rp.send(&agent.Frame{Type: agent.FrameError, Error: aerr}); err != nil {
		s.log.Debug("cannot send error", "err", err)
	}
}

func readRequest(r *bufio.Reader) (*agent.Request, error) {
	line, err := agent.ReadLine(r, agent.MaxLineBytes)
	if err != nil {
		return nil, agent.Errorf(errdefs.InvalidArgument, "read request: %v", err)
	}
	var req agent.Request
	if err := json.NewDecoder(bytes.NewReader(line)).Decode(&req); err != nil {
		return nil, agent.Errorf(errdefs.InvalidArgument, "decode request: %v", err)
	}
	if req.V != agent.ProtocolVersion {
		return nil, agent.Errorf(errdefs.InvalidArgument, "protocol version %d not supported (want %d)", req.V, agent.ProtocolVersion)
	}
	if req.Len < 0 {
		return nil, agent.Errorf(errdefs.InvalidArgument, "negative payload length")
	}
	return &req, nil
}

func (s *Server) dispatch(req *agent.Request, c net.Conn, r *bufio.Reader, rp *reply) error {
	if req.Len > 0 && req.Op != agent.OpStart && req.Op != agent.OpWriteFile {
		return agent.Errorf(errdefs.InvalidArgument, "%s takes no payload", req.Op)
	}
	if req.Follow && req.Op != agent.OpStart {
		return agent.Errorf(errdefs.InvalidArgument, "follow: only a start follows its job, not %s", req.Op)
	}
	switch req.Op {
	case agent.OpPing:
		total, running := s.jobs.counts()
		return rp.send(&agent.Frame{Type: agent.FrameResult, Info: &agent.Info{
			Version: version.Version, Protocol: agent.ProtocolVersion, PID: os.Getpid(), Started: s.started,
			UptimeMS: time.Since(s.started).Milliseconds(), Jobs: total, Running: running,
		}})
	case agent.OpStart:
		return s.start(req, c, r, rp)
	case agent.OpAttach, agent.OpInteractive:
		j, err := s.jobs.get(req.JobID)
		if err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Time{}) // streams last as long as the job
		if req.Op == agent.OpAttach {
			return s.attach(j, req, r, rp)
		}
		return s.interactive(j, [2]int64{req.StdoutOffset, req.StderrOffset}, r, rp)
	case agent.OpRead:
		j, err := s.jobs.get(req.JobID)
		if err != nil {
			return err
		}
		return s.read(j, req, rp)
	case agent.OpSignal:
		j, err := s.jobs.get(req.JobID)
		if err != nil {
			return err
		}
		if err := j.signal(req.Signal); err != nil {
			return err
		}
		return rp.send(&agent.Frame{Type: agent.FrameResult})
	case agent.OpJobs:
		for _, j := range s.jobs.list() {
			if j.sudo {
				continue // the daemon did not start it (sudo.go)
			}
			ji := j.info()
			if err := rp.send(&agent.Frame{Type: agent.FrameEntry, Job: &ji}); err != nil {
				return err
			}
		}
		return rp.send(&agent.Frame{Type: agent.FrameResult})
	case agent.OpForget:
		if err := s.jobs.forget(req.JobID); err != nil {
			return err
		}
		return rp.send(&agent.Frame{Type: agent.FrameResult})
	case agent.OpConnect:
		return s.connect(req, c, r, rp)
	case agent.OpReadFile, agent.OpWriteFile, agent.OpListFiles, agent.OpDeleteFile, agent.OpStat:
		if req.Op == agent.OpWriteFile {
			_ = c.SetReadDeadline(time.Now().Add(transferTimeout))
		}
		return s.files.serve(req, r, rp)
	}
	return agent.Errorf(errdefs.InvalidArgument, "unknown op %q", req.Op)
}

func (s *Server) start(req *agent.Request, c net.Conn, r *bufio.Reader, rp *reply) error {
	if req.Exec == nil {
		return agent.Errorf(errdefs.InvalidArgument, "start without exec")
	}
	if req.Len > agent.MaxStdinBytes {
		return agent.Errorf(errdefs.LimitExceeded, "stdin of %d bytes exceeds %d", req.Len, agent.MaxStdinBytes)
	}
	stdin := make([]byte, req.Len)
	if _, err := io.ReadFull(r, stdin); err != nil {
		return agent.Errorf(errdefs.InvalidArgument, "read stdin payload: %v", err)
	}
	j, err := s.jobs.start(req.Exec, stdin)
	if err != nil {
		return err
	}
	if err := rp.send(&agent.Frame{Type: agent.FrameResult, JobID: j.id}); err != nil || !req.Follow {
		return err
	}
	// Follow: the rest of an attach from offset 0, then the forget the
	// client would send next — unless it went away before the exit was
	// sent: then the job stays for a later attach.
	_ = c.SetReadDeadline(time.Time{}) // the stream lasts as long as the job
	delivered, err := s.follow(j, [2]int64{}, r, rp)
	if delivered {
		if ferr := s.jobs.forget(j.id); ferr != nil {
			s.log.Debug("followed job not forgotten", "job", j.id, "err", ferr)
		}
	}
	return err
}

func (s *Server) read(j *job, req *agent.Request, rp *reply) error {
	limit := int(req.Max)
	if limit <= 0 || limit > agent.MaxReadBytes {
		limit = agent.MaxReadBytes
	}
	j.mu.Lock()
	out, outOff := j.streams[stdoutIdx].read(req.StdoutOffset, limit)
	errb, errOff := j.streams[stderrIdx].read(req.StderrOffset, limit)
	exit := j.exit
	j.mu.Unlock()
	rr := &agent.ReadResult{
		State:        agent.StateRunning,
		StdoutOffset: outOff, StderrOffset: errOff,
		StdoutLen: len(out), StderrLen: len(errb),
		NextStdoutOffset: outOff + int64(len(out)), NextStderrOffset: errOff + int64(len(errb)),
		Exit: exit,
	}
	if exit != nil {
		rr.State = agent.StateFinished
	}
	return rp.send(&agent.Frame{Type: agent.FrameResult, Read: rr}, out, errb)
}

// attach streams output until the job ends.
func (s *Server) attach(j *job, req *agent.Request, r *bufio.Reader, rp *reply) error {
	_, err := s.follow(j, [2]int64{req.StdoutOffset, req.StderrOffset}, r, rp)
	return err
}

// follow streams output from offs until the job ends, and says whether
// its exit frame was sent. The client sends nothing after its request, so
// anything read (normally EOF) means it has gone.
func (s *Server) follow(j *job, offs [2]int64, r *bufio.Reader, rp *reply) (bool, error) {
	gone := make(chan struct{})
	go func() {
		_, _ = r.ReadByte()
		close(gone)
	}()
	return s.stream(j, offs, gone, rp)
}

// stream sends a job's output from offs as it arrives, then its exit
// status, and says whether that was sent. It returns early, without error,
// when gone is closed.
func (s *Server) stream(j *job, offs [2]int64, gone <-chan struct{}, rp *reply) (bool, error) {
	j.mu.Lock()
	f := j.follow(offs)
	j.releaseHeld() // the attach it stood in for has come
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		j.advance(f, offs, true)
		j.mu.Unlock()
	}()
	for {
		j.mu.Lock()
		var chunks [2][]byte
		for i := range chunks {
			chunks[i], offs[i] = j.streams[i].read(offs[i], agent.MaxChunkBytes)
		}
		exit, changed := j.exit, j.changed
		j.mu.Unlock()

		sent := false
		for i, data := range chunks {
			if len(data) == 0 {
				continue
			}
			if err := rp.send(&agent.Frame{Type: agent.FrameOutput, Stream: streamNames[i], Offset: offs[i]}, data); err != nil {
				return false, fmt.Errorf("%w: send output: %w", errAbort, err)
			}
			offs[i] += int64(len(data))
			sent = true
		}
		if sent {
			j.mu.Lock()
			j.advance(f, offs, false)
			j.mu.Unlock()
			continue
		}
		// The exit status is set only after all output was collected, so
		// nothing can follow it.
		if exit != nil {
			err := rp.send(&agent.Frame{Type: agent.FrameExit, Exit: exit})
			return err == nil, err
		}
		select {
		case <-changed:
		case <-gone:
			return false, nil
		}
	}
}

// interactive streams output from offs like attach while applying the
// input frames the client sends.
func (s *Server) interactive(j *job, offs [2]int64, r *bufio.Reader, rp *reply) error {
	// An interactive job that has finished already (a fast command whose
	// session opened late) has nothing left to take input, but its output
	// and exit are still the session's to deliver.
	if !j.hasInput() && !((j.tty || j.openStdin) && j.exitStatus() != nil) {
		return agent.Errorf(errdefs.Conflict, "job %s has neither a terminal nor an open stdin", j.id)
	}
	if err := rp.send(&agent.Frame{Type: agent.FrameResult}); err != nil {
		return err
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		// input returns only when the client's side ends: EOF is the normal end.
		if err := s.input(j, r); !errors.Is(err, io.EOF) {
			s.log.Warn("interactive input ended", "job", j.id, "err", err)
		}
	}()
	_, err := s.stream(j, offs, gone, rp)
	return err
}

// input applies the client's frames until EOF or a protocol error; it never
// returns nil.
// Operational failures (stdin already closed, job gone) are logged and do
// not end the session: the output side still has the exit to deliver.
func (s *Server) input(j *job, r *bufio.Reader) error {
	for {
		f, err := agent.ReadFrame(r, agent.MaxChunkBytes)
		if err != nil {
			return err
		}
		var opErr error
		switch f.Type {
		case agent.FrameStdin:
			buf := make([]byte, f.Len)
			if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			opErr = j.writeStdin(buf)
		case agent.FrameCloseStdin:
			opErr = j.endInput()
		case agent.FrameResize:
			opErr = j.resize(f.Rows, f.Cols)
		default:
			return fmt.Errorf("%w: unexpected %q frame from client", agent.ErrProtocol, f.Type)
		}
		if opErr != nil {
			s.log.Debug("interactive input not applied", "job", j.id, "frame", f.Type, "err", opErr)
		}
	}
}
