package server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// drainGrace is how long output is still collected after a job's leader
// has exited. Background processes that keep the pipes open must not keep
// the job unfinished forever; what they write after that is not collected
// (they keep running until killed or the agent terminates).
const drainGrace = 300 * time.Millisecond

// Stream indexes into job.streams.
const (
	stdoutIdx = 0
	stderrIdx = 1
)

var streamNames = [2]string{agent.StreamStdout, agent.StreamStderr}

// jobTable holds every running and retained finished job.
type jobTable struct {
	log    *slog.Logger
	reaper *reaper
	opts   *Options
	// cgroups gives every job its own cgroup; nil without delegation.
	cgroups *jobCgroups
	self    string // the agent's executable, run as the job-exec helper

	mu       sync.Mutex
	jobs     map[string]*job
	finished []string // ids of finished jobs, oldest first
	// lingering are cgroups of finished jobs that background processes
	// still occupy; removed once empty.
	lingering []*jobCgroup

	spareMu   sync.Mutex
	spare     *spare // a helper waiting in its job cgroup (spare.go); nil if none
	preparing bool   // a spare is being started
	closed    bool   // killAll ran: no more spares
}

func newJobTable(log *slog.Logger, r *reaper, o *Options) *jobTable {
	return &jobTable{log: log, reaper: r, opts: o, jobs: map[string]*job{}}
}

// job is one command. Its process is the leader of its own session and
// process group, whose id is pid.
type job struct {
	id          string
	argv        []string
	tty         bool
	openStdin   bool // started with OpenStdin: an interactive job
	pid         int
	cg          *jobCgroup // nil without per-job cgroups
	startedAt   time.Time
	outputLimit int64
	timeout     time.Duration
	table       *jobTable
	// sudo marks a command started for a sudo client (sudo.go), which
	// the daemon does not know and the job list does not show.
	sudo bool

	readers     []*os.File    // parent ends of stdout/stderr, or the pty master
	readersDone chan struct{} // closed when every reader has hit EOF
	pty         *os.File      // pty master, for resize; nil without tty

	stdinMu sync.Mutex
	stdin   *os.File // pipe write end or pty master; nil when closed or absent

	mu      sync.Mutex
	streams [2]output
	changed chan struct{} // closed and replaced whenever output or state changes
	// followers are the attached readers' positions. While one of them is
	// about to lose output (it is further behind than the retained tail),
	// the job stops reading its pipes, so the program blocks on write the
	// way it would on a slow terminal: an attached daemon sees every byte.
	// With nobody attached (say the daemon is restarting) output is never
	// held back and only the tail is kept.
	followers map[*follower]struct{}
	// held stands in for the attach the daemon is about to make
	// (ExecRequest.HoldOutput) until it comes or HoldGrace passes.
	held *follower
	// holdTimer releases held after HoldGrace. It is stopped when the
	// attach comes: a pending timer's function keeps the job, and with it
	// up to twice RetainBytes of output per stream, reachable for the
	// whole HoldGrace after a forgotten job (3.1 MiB of heap per sandbox
	// after 20 quick commands of 100 KiB output, docs/ARCHITECTURE.md).
	// Stopping is not enough: a stopped timer stays in its P's timer heap,
	// function and all, until that P next cleans the heap (Go's
	// runtime/time.go), which an idle agent may not do for long. So the
	// function reaches the job only through holdOf, cleared on release.
	holdTimer *time.Timer
	holdOf    *atomic.Pointer[job]
	// awaited mirrors held != nil for the job table, which must not take
	// j.mu: a finished job the daemon has not attached to yet is not
	// dropped to make room (its exit status is what the daemon waits for).
	awaited atomic.Bool
	// unheld is closed when held is released; an exited job's drain grace
	// starts only then, so held output still reaches the late attach.
	unheld     chan struct{}
	consumed   chan struct{} // closed and replaced whenever a follower advances or leaves
	killCause  string
	killDetail string
	timer      *time.Timer
	exit       *agent.ExitStatus
}

func newJobID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return "j-" + hex.EncodeToString(b[:])
}

func (t *jobTable) get(id string) (*job, error) {
	if err := agent.ValidateJobID(id); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	j, ok := t.jobs[id]
	if !ok {
		return nil, agent.Errorf(errdefs.NotFound, "job %s not found", id)
	}
	return j, nil
}

func (t *jobTable) add(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs[j.id] = j
}

// list returns all jobs, oldest started first.
func (t *jobTable) list() []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*job, 0, len(t.jobs))
	for _, j := range t.jobs {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b *job) int { return a.startedAt.Compare(b.startedAt) })
	return out
}

// counts returns the number of jobs and of running ones.
func (t *jobTable) counts() (total, running int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.jobs), len(t.jobs) - len(t.finished)
}

// markFinished records that j finished and drops the oldest finished jobs
// beyond --max-finished, sparing those the daemon has yet to attach to: with
// many commands finishing at once, the oldest could otherwise be gone before
// the daemon asks how it ended.
func (t *jobTable) markFinished(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Usage has been read; an empty cgroup is not needed any more.
	if j.cg != nil && j.cg.remove() == nil {
		j.cg = nil
	}
	t.finished = append(t.finished, j.id)
	excess := len(t.finished) - t.opts.MaxFinished
	kept := t.finished[:0]
	for _, id := range t.finished {
		if excess > 0 && !t.jobs[id].awaited.Load() {
			t.releaseCgroup(t.jobs[id])
			delete(t.jobs, id)
			excess--
			continue
		}
		kept = append(kept, id)
	}
	t.finished = kept
}

// releaseCgroup removes a dropped job's cgroup, or keeps it for a later
// sweep while background processes of the job still run. Callers hold t.mu.
func (t *jobTable) releaseCgroup(j *job) {
	if j == nil || j.cg == nil {
		return
	}
	if j.cg.remove() != nil {
		t.lingering = append(t.lingering, j.cg)
	}
	j.cg = nil
}

// linger removes g, or keeps it for a later sweep while processes remain.
func (t *jobTable) linger(g *jobCgroup) {
	if g.remove() != nil {
		t.mu.Lock()
		t.lingering = append(t.lingering, g)
		t.mu.Unlock()
	}
}

// sweepLingering removes the cgroups of finished jobs that have emptied.
func (t *jobTable) sweepLingering() {
	t.mu.Lock()
	defer t.mu.Unlock()
	kept := t.lingering[:0]
	for _, g := range t.lingering {
		if g.remove() != nil {
			kept = append(kept, g)
		}
	}
	t.lingering = kept
}

// forget drops a finished job.
func (t *jobTable) forget(id string) error {
	j, err := t.get(id)
	if err != nil {
		return err
	}
	if j.exitStatus() == nil {
		return agent.Errorf(errdefs.Conflict, "job %s is still running", id)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.releaseCgroup(j)
	delete(t.jobs, id)
	for i, fid := range t.finished {
		if fid == id {
			t.finished = append(t.finished[:i], t.finished[i+1:]...)
			break
		}
	}
	return nil
}

// killAll kills every running job, for shutdown, and what finished jobs
// left running in the background. As PID 1 the kernel would do the latter
// when the agent exits; elsewhere nothing else would.
func (t *jobTable) killAll() {
	t.spareMu.Lock()
	t.closed = true
	if t.spare != nil {
		_ = unix.Kill(t.spare.pid, unix.SIGKILL) // its exit removes its cgroup
		t.spare = nil
	}
	t.spareMu.Unlock()
	for _, j := range t.list() {
		j.kill(agent.CauseKilled, "agent terminated")
		killSession(j.pid)
		if g := j.cgroup(); g != nil {
			_ = g.kill()
		}
	}
	t.mu.Lock()
	for _, g := range t.lingering {
		_ = g.kill()
	}
	t.mu.Unlock()
	t.sweepLingering()
}

// cgroup returns the job's cgroup while it has one.
func (j *job) cgroup() *jobCgroup {
	j.table.mu.Lock()
	defer j.table.mu.Unlock()
	return j.cg
}

// exitStatus returns the exit status, or nil while the job runs.
func (j *job) exitStatus() *agent.ExitStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.exit
}

// broadcast wakes every waiter on j.changed. Callers hold j.mu.
func (j *job) broadcast() {
	close(j.changed)
	j.changed = make(chan struct{})
}

// follower is one attached reader's position in each stream.
type follower struct{ offs [2]int64 }

// follow registers an attached reader starting at offs. Callers hold j.mu.
func (j *job) follow(offs [2]int64) *follower {
	f := &follower{offs: offs}
	if j.followers == nil {
		j.followers = map[*follower]struct{}{}
	}
	j.followers[f] = struct{}{}
	return f
}

// releaseHeld drops the stand-in follower of HoldOutput. Callers hold j.mu.
func (j *job) releaseHeld() {
	if j.held != nil {
		j.holdTimer.Stop()
		j.holdOf.Store(nil)
		j.advance(j.held, j.held.offs, true)
		j.held = nil
		j.awaited.Store(false)
		close(j.unheld)
	}
}

// advance records that f has consumed up to offs (or, with gone, left) and
// wakes a writer waiting for it. Callers hold j.mu.
func (j *job) advance(f *follower, offs [2]int64, gone bool) {
	f.offs = offs
	if gone {
		delete(j.followers, f)
	}
	if j.consumed != nil {
		close(j.consumed)
	}
	j.consumed = make(chan struct{})
}

// followerBehind reports whether writing up to newEnd on stream idx would
// drop output a follower has not read yet. Callers hold j.mu.
func (j *job) followerBehind(idx int, newEnd int64) bool {
	for f := range j.followers {
		if f.offs[idx] < newEnd-int64(j.streams[idx].retain) {
			return true
		}
	}
	return false
}

// appendOutput records output of stream idx, enforcing the output limit
// and holding the writer back while an attached reader would lose output.
func (j *job) appendOutput(idx int, p []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.followerBehind(idx, j.streams[idx].end()+int64(len(p))) && j.exit == nil {
		if j.consumed == nil {
			j.consumed = make(chan struct{})
		}
		wait := j.consumed
		j.mu.Unlock()
		<-wait
		j.mu.Lock()
	}
	s := &j.streams[idx]
	if j.outputLimit > 0 && s.end()+int64(len(p)) > j.outputLimit {
		p = p[:max(0, j.outputLimit-s.end())]
		if j.killCause == "" {
			j.killCause = agent.CauseOutputLimit
			j.killDetail = fmt.Sprintf("%s exceeded %d bytes", streamNames[idx], j.outputLimit)
			// Not inline: killing sweeps /proc, and j.mu is held here.
			go j.killProcesses()
		}
	}
	if len(p) == 0 {
		return
	}
	s.write(p)
	j.broadcast()
}

// readLoop copies one output source into the job until EOF.
func (j *job) readLoop(idx int, f *os.File, wg *sync.WaitGroup) {
	defer wg.Done()
	// Never read more than the retained tail at once: a held-back chunk
	// larger than the tail could never be appended while a reader waits
	// at its start.
	buf := make([]byte, min(32<<10, j.streams[idx].retain))
	for {
		n, err := f.Read(buf)
		if n > 0 {
			j.appendOutput(idx, buf[:n])
		}
		if err != nil {
			// EOF for pipes; EIO for a pty master once the terminal is
			// closed; a deadline error after drainGrace.
			return
		}
	}
}

// kill kills the job's process group and every process left in its
// session or group, recording cause unless one was recorded already.
func (j *job) kill(cause, detail string) {
	j.mu.Lock()
	if j.exit != nil {
		j.mu.Unlock()
		return
	}
	if j.killCause == "" {
		j.killCause, j.killDetail = cause, detail
	}
	j.mu.Unlock()
	j.killProcesses()
}

// killProcesses empties the job's cgroup, which holds every process the
// job started whatever they did; without one it SIGKILLs the job's process
// group and then every process left in its session or group.
func (j *job) killProcesses() {
	if g := j.cgroup(); g != nil {
		if err := g.kill(); err == nil {
			return
		} else {
			j.table.log.Warn("kill job cgroup", "job", j.id, "err", err)
		}
	}
	j.table.reaper.signalGroup(j.pid, unix.SIGKILL)
	killSession(j.pid)
}

// onExit is called by the reaper with the leader's wait status and usage.
func (j *job) onExit(ws unix.WaitStatus, ru *unix.Rusage) {
	finishedAt := time.Now()
	// ru_maxrss is in KiB; with RUSAGE_BOTH's semantics it is the largest
	// of the leader and the descendants it waited for.
	maxRSS := uint64(max(ru.Maxrss, 0)) << 10
	go func() {
		if j.awaited.Load() {
			select {
			case <-j.unheld:
			case <-j.readersDone:
			}
		}
		select {
		case <-j.readersDone:
		case <-time.After(drainGrace):
			for _, f := range j.readers {
				_ = f.SetReadDeadline(time.Now())
			}
			<-j.readersDone
		}
		j.finish(ws, finishedAt, maxRSS)
	}()
}

// finish records the exit status once output has been drained. maxRSS is
// the memory peak wait4 reported for the job's leader.
func (j *job) finish(ws unix.WaitStatus, finishedAt time.Time, maxRSS uint64) {
	for _, f := range j.readers {
		f.Close()
	}
	j.closeStdin()
	j.mu.Lock()
	if j.timer != nil {
		j.timer.Stop()
	}
	e := &agent.ExitStatus{
		StartedAt:   j.startedAt,
		FinishedAt:  finishedAt,
		DurationMS:  finishedAt.Sub(j.startedAt).Milliseconds(),
		StdoutBytes: j.streams[stdoutIdx].end(),
		StderrBytes: j.streams[stderrIdx].end(),
	}
	switch {
	case ws.Signaled():
		e.Cause, e.ExitCode, e.Signal = agent.CauseSignal, 128+int(ws.Signal()), unix.SignalName(ws.Signal())
	default:
		e.Cause, e.ExitCode = agent.CauseExited, ws.ExitStatus()
	}
	// An output limit truncated the output whatever happened next; a
	// timeout or kill only counts if our SIGKILL is what ended the job.
	if j.killCause == agent.CauseOutputLimit || (j.killCause != "" && ws.Signaled() && ws.Signal() == unix.SIGKILL) {
		e.Cause, e.Detail = j.killCause, j.killDetail
	}
	for i := range j.streams {
		j.streams[i].shrink()
	}
	if j.cg != nil {
		e.CPUSeconds, e.MemoryPeakBytes, e.OOMKills = j.cg.usage()
	}
	if e.MemoryPeakBytes == 0 {
		// No memory cgroup of the job's own (see jobCgroups): the peak
		// resident set of its process tree as far as wait4 saw it.
		e.MemoryPeakBytes = maxRSS
	}
	j.exit = e
	j.broadcast()
	j.mu.Unlock()
	j.table.markFinished(j)
	j.table.log.Info("job finished", "job", j.id, "pid", j.pid, "cause", e.Cause, "exit_code", e.ExitCode, "duration_ms", e.DurationMS)
}

// writeStdin writes p to the job's stdin.
func (j *job) writeStdin(p []byte) error {
	j.stdinMu.Lock()
	defer j.stdinMu.Unlock()
	if j.stdin == nil {
		return agent.Errorf(errdefs.Conflict, "stdin of job %s is closed", j.id)
	}
	if _, err := j.stdin.Write(p); err != nil {
		return agent.Errorf(errdefs.Conflict, "write stdin: %v", err)
	}
	return nil
}

// eofChar is the default VEOF character (^D) of a terminal.
const eofChar = 0x04

// endInput closes a pipe stdin, or types end-of-file on a terminal (whose
// master must stay open for output).
func (j *job) endInput() error {
	if j.tty {
		return j.writeStdin([]byte{eofChar})
	}
	j.closeStdin()
	return nil
}

// closeStdin releases the stdin pipe; the pty master is closed with the
// readers.
func (j *job) closeStdin() {
	j.stdinMu.Lock()
	defer j.stdinMu.Unlock()
	if j.stdin != nil && !j.tty {
		j.stdin.Close()
	}
	j.stdin = nil
}

// resize sets the terminal size of a tty job.
func (j *job) resize(rows, cols uint16) error {
	if j.pty == nil {
		return agent.Errorf(errdefs.InvalidArgument, "job %s has no terminal", j.id)
	}
	if rows == 0 || cols == 0 {
		return agent.Errorf(errdefs.InvalidArgument, "terminal size %dx%d", rows, cols)
	}
	j.stdinMu.Lock()
	defer j.stdinMu.Unlock()
	if j.stdin == nil {
		return agent.Errorf(errdefs.Conflict, "terminal of job %s is closed", j.id)
	}
	if err := unix.IoctlSetWinsize(int(j.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	return nil
}

// signal delivers a signal to the job's process group.
func (j *job) signal(name string) error {
	sig, err := parseSignal(name)
	if err != nil {
		return err
	}
	if j.exitStatus() != nil {
		return agent.Errorf(errdefs.Conflict, "job %s has finished", j.id)
	}
	if sig == unix.SIGKILL {
		j.kill(agent.CauseKilled, "killed by request")
		return nil
	}
	if !j.table.reaper.signalGroup(j.pid, sig) {
		return agent.Errorf(errdefs.Conflict, "job %s has exited", j.id)
	}
	return nil
}

// parseSignal accepts "SIGTERM", "TERM" (any case) or a number.
func parseSignal(s string) (unix.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, agent.Errorf(errdefs.InvalidArgument, "signal %d out of range", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, agent.Errorf(errdefs.InvalidArgument, "unknown signal %q", s)
}

// info describes the job.
func (j *job) info() agent.JobInfo {
	j.mu.Lock()
	defer j.mu.Unlock()
	ji := agent.JobInfo{
		ID: j.id, Argv: j.argv, PID: j.pid, TTY: j.tty, StartedAt: j.startedAt,
		StdoutBytes: j.streams[stdoutIdx].end(), StderrBytes: j.streams[stderrIdx].end(),
		State: agent.StateRunning, Exit: j.exit,
	}
	if j.exit != nil {
		ji.State = agent.StateFinished
	}
	return ji
}

// hasInput reports whether the job has a terminal or a stdin still open.
func (j *job) hasInput() bool {
	j.stdinMu.Lock()
	defer j.stdinMu.Unlock()
	return j.stdin != nil
}
