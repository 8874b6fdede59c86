package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	rtrace "runtime/trace"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Termination causes (docs/SPEC.md "Termination causes").
const (
	CauseExited      = apitypes.CauseExited
	CauseTimeout     = apitypes.CauseTimeout
	CauseOOM         = apitypes.CauseOOM
	CauseOutputLimit = apitypes.CauseOutputLimit
	CauseSignal      = apitypes.CauseSignal
	CauseKilled      = apitypes.CauseKilled
	CauseLost        = apitypes.CauseLost
)

// ExecSpec is a command to run in a sandbox, already validated.
type ExecSpec struct {
	Argv []string
	// Command is the shell line of a request that gave one (Argv is then
	// /bin/sh -c Command): a guest agent runs it with the guest's own
	// shell (cmd.exe on Windows).
	Command string
	Env     map[string]string // on top of the image's and the sandbox's environment
	Cwd     string            // default /workspace
	Stdin   []byte
	Timeout time.Duration // 0: none
	// MaxResultBytes caps how much of each stream the result carries; 0 means
	// the output limit. The command itself may write up to the output limit.
	MaxResultBytes int64
	UID            *int // default: the sandbox user
}

// Termination says how a command ended.
type Termination = apitypes.Termination

// ExecResult is the outcome of a command.
type ExecResult = apitypes.ExecResult

// OutputFunc receives output as it arrives ("stdout" or "stderr").
type OutputFunc func(stream string, data []byte)

// beginCommand marks a command as in flight (ready → running on the first).
func (m *Manager) beginCommand(ctx context.Context, sb *Sandbox) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.terminating || !(sb.state == StateReady || sb.state == StateRunning) {
		return errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	if sb.busy == busyRestore {
		return errdefs.Conflictf("sandbox %s is being restored from a snapshot", sb.ID)
	}
	if sb.running == 0 {
		if err := m.commandTransitionLocked(ctx, sb, StateRunning, "command started", time.Time{}); err != nil {
			return err
		}
	}
	sb.running++
	sb.lastActive = m.opt.Now()
	return nil
}

func (sb *Sandbox) stateNameLocked() string {
	if sb.terminating {
		return "terminating"
	}
	return string(sb.state)
}

// endCommand marks a command as finished (running → ready on the last).
func (m *Manager) endCommand(sb *Sandbox) {
	ctx := context.Background()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.running--
	now := m.opt.Now()
	sb.lastActive = now
	select {
	case <-m.closed:
		// A daemon shutting down loses its job watchers' connections while
		// the jobs run on: the next daemon's reconciliation finds them, and
		// "ready" recorded now would be wrong (and the store is closing).
		return
	default:
	}
	if sb.running == 0 && sb.state == StateRunning && !sb.terminating {
		if err := m.commandTransitionLocked(ctx, sb, StateReady, "commands finished", now.UTC()); err != nil {
			m.log.Error("sandbox back to ready", "sandbox", sb.ID, "err", err)
		}
	}
}

// touch records activity that is not a command (file access).
func (m *Manager) touch(sb *Sandbox) {
	sb.mu.Lock()
	sb.lastActive = m.opt.Now()
	sb.mu.Unlock()
}

// env builds a command's environment: defaults, then the image's, the
// sandbox's and the request's variables, later ones winning.
func (sb *Sandbox) env(extra map[string]string) []string {
	defaults := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": "/home/sandbox", "USER": "sandbox", "LANG": "C.UTF-8", "HOSTNAME": sb.ID,
	}
	return MergeEnv(defaults, sb.spec.ImageEnv, sb.spec.Env, sb.spec.NetEnv, extra)
}

// MergeEnv flattens layers of variables into sorted KEY=VALUE, later layers
// winning.
func MergeEnv(layers ...map[string]string) []string {
	vars := map[string]string{}
	for _, layer := range layers {
		for k, v := range layer {
			vars[k] = v
		}
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Exec runs a command in sandbox id and waits for it. onOutput, if not nil,
// sees the output as it comes.
func (m *Manager) Exec(ctx context.Context, id string, spec ExecSpec, onOutput OutputFunc) (*ExecResult, error) {
	// Each step is an execution-tracer region, as on the create path
	// (docs/ARCHITECTURE.md "Where an exec's time goes").
	defer rtrace.StartRegion(ctx, "sandbox.exec").End()
	reg := rtrace.StartRegion(ctx, "exec.lookup")
	sb, caps, err := m.lookupFor(ctx, id, CapExec)
	reg.End()
	if err != nil {
		return nil, err
	}
	reg = rtrace.StartRegion(ctx, "exec.running-transition")
	err = m.beginCommand(ctx, sb)
	reg.End()
	if err != nil {
		return nil, err
	}
	defer func() {
		defer rtrace.StartRegion(ctx, "exec.ready-transition").End()
		m.endCommand(sb)
	}()
	if !caps.Agent {
		return m.guestExec(ctx, sb, spec, onOutput)
	}
	return m.agentExec(ctx, sb, spec, onOutput)
}

// agentExec runs spec through sb's agent on one connection: the start,
// the output and exit as an attach from offset 0 gets them, and the
// agent's forgetting of the delivered job (agent.Client.Run). Held
// output: an agent that does not follow on that connection keeps every
// byte for the attach that Run then makes.
func (m *Manager) agentExec(ctx context.Context, sb *Sandbox, spec ExecSpec, onOutput OutputFunc) (*ExecResult, error) {
	start := time.Now()
	limit := spec.MaxResultBytes
	if limit <= 0 || (m.opt.OutputLimit > 0 && limit > m.opt.OutputLimit) {
		limit = m.opt.OutputLimit
	}
	stdout, stderr := newCapBuffer(limit), newCapBuffer(limit)
	oomBefore, _ := sb.oomKills()
	reg := rtrace.StartRegion(ctx, "exec.agent-run")
	jobID := ""
	exit, err := sb.agent.Run(ctx, m.execRequest(sb, spec, nil, true, false), func(id string) {
		jobID = id
		sb.addJob(id, oomBefore)
	}, func(c agent.Chunk) error {
		switch c.Stream {
		case "stdout":
			stdout.Write(c.Data)
		case "stderr":
			stderr.Write(c.Data)
		default:
			return fmt.Errorf("agent sent unknown stream %q", c.Stream)
		}
		if onOutput != nil {
			onOutput(c.Stream, c.Data)
		}
		m.publishOutput(sb, jobID, c)
		return nil
	})
	reg.End()
	if jobID == "" {
		return nil, m.agentError(sb, err, "start command")
	}
	return m.execResult(ctx, sb, jobID, exit, err, stdout, stderr, oomBefore, start)
}

// execResult is the result of job jobID, which ended with exit (or the
// agent's err while it was followed), its output in stdout and stderr.
func (m *Manager) execResult(ctx context.Context, sb *Sandbox, jobID string, exit *agent.ExitStatus, err error, stdout, stderr *capBuffer, oomBefore uint64, start time.Time) (*ExecResult, error) {
	res := &ExecResult{
		JobID: jobID, Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutTruncated: stdout.Truncated(), StderrTruncated: stderr.Truncated(),
		StdoutBytes: stdout.Total(), StderrBytes: stderr.Total(),
	}
	if err != nil {
		if ctx.Err() != nil {
			// The caller went away: do not leave the command running unseen.
			kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = sb.agent.Signal(kctx, jobID, "SIGKILL")
			cancel()
			return nil, errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "command cancelled")
		}
		res.DurationMS = time.Since(start).Milliseconds()
		res.ExitCode = -1
		res.Termination = m.lostTermination(sb, oomBefore, err)
		return res, nil
	}
	res.DurationMS = exit.DurationMS
	res.ExitCode = exit.ExitCode
	res.Termination = m.termination(sb, exit, oomBefore)
	res.Usage = jobUsage(exit)
	res.BlockedSyscalls = blockedSyscalls(sb, jobID)
	// The outcome is delivered, and the agent forgot the job (Run).
	sb.mu.Lock()
	delete(sb.jobs, jobID)
	sb.mu.Unlock()
	return res, nil
}

// blockedSyscalls are the syscalls seccomp refused job, by name. The job
// has ended, and refused calls are counted before they return, so the
// counts are complete.
func blockedSyscalls(sb *Sandbox, jobID string) []apitypes.BlockedSyscall {
	r, ok := sb.handle.(SyscallReporter)
	if !ok {
		return nil
	}
	counts := r.BlockedSyscalls(jobID)
	out := make([]apitypes.BlockedSyscall, 0, len(counts))
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, apitypes.BlockedSyscall{Name: name, Count: counts[name]})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// jobUsage is the usage the agent measured in the job's cgroup, if any.
func jobUsage(exit *agent.ExitStatus) *apitypes.JobUsage {
	if exit.CPUSeconds == 0 && exit.MemoryPeakBytes == 0 {
		return nil
	}
	return &apitypes.JobUsage{CPUSeconds: exit.CPUSeconds, MemoryPeakBytes: exit.MemoryPeakBytes}
}

// termination turns the agent's report (untrusted) into a Termination,
// attributing SIGKILLs to the OOM killer when the cgroup's counter moved.
func (m *Manager) termination(sb *Sandbox, exit *agent.ExitStatus, oomBefore uint64) Termination {
	code := exit.ExitCode
	t := Termination{Cause: exit.Cause, Signal: exit.Signal, Detail: exit.Detail}
	switch exit.Cause {
	case CauseExited:
		t.ExitCode = &code
	case CauseSignal, CauseTimeout, CauseOutputLimit, CauseKilled:
	default:
		t = Termination{Cause: CauseLost, Detail: fmt.Sprintf("agent reported unknown cause %.40q", exit.Cause)}
	}
	if exit.Signal == "SIGKILL" && (t.Cause == CauseSignal || t.Cause == CauseKilled) {
		// The job's own counter (where its cgroup has a memory
		// controller), or the sandbox's.
		if n, err := sb.oomKills(); exit.OOMKills > 0 || (err == nil && n > oomBefore) {
			t.Cause, t.Detail = CauseOOM, fmt.Sprintf("killed by the OOM killer (memory limit %d bytes)", sb.spec.Limits.MemoryBytes)
		}
	}
	if t.Cause == CauseSignal || t.Cause == CauseKilled {
		sb.mu.Lock()
		if sb.terminating {
			t.Cause, t.Detail = CauseKilled, "sandbox terminated"
		}
		sb.mu.Unlock()
	}
	return t
}

// lostTermination explains a command whose outcome the agent could not report.
func (m *Manager) lostTermination(sb *Sandbox, oomBefore uint64, err error) Termination {
	sb.mu.Lock()
	terminating := sb.terminating
	sb.mu.Unlock()
	if n, cerr := sb.oomKills(); cerr == nil && n > oomBefore {
		return Termination{Cause: CauseOOM, Detail: "the OOM killer ended the sandbox"}
	}
	if terminating {
		return Termination{Cause: CauseKilled, Detail: "sandbox terminated"}
	}
	return Termination{Cause: CauseLost, Detail: err.Error()}
}

// agentError maps a failed agent call onto the taxonomy.
func (m *Manager) agentError(sb *Sandbox, err error, what string) error {
	var ae *agent.Error
	if errors.As(err, &ae) {
		code := ae.Code
		switch code {
		case errdefs.InvalidArgument, errdefs.NotFound, errdefs.Conflict, errdefs.LimitExceeded:
			return errdefs.Wrap(code, err, "%s", ae.Message)
		}
		return errdefs.Wrap(errdefs.Internal, err, "%s: %s", what, ae.Message)
	}
	sb.mu.Lock()
	terminating := sb.terminating
	sb.mu.Unlock()
	if terminating {
		return errdefs.Conflictf("sandbox %s was terminated", sb.ID)
	}
	return errdefs.Wrap(errdefs.Unavailable, err, "%s: sandbox agent unreachable", what)
}

// capBuffer keeps the first max bytes written to it and counts the rest.
type capBuffer struct {
	max   int64
	buf   strings.Builder
	total int64
}

func newCapBuffer(max int64) *capBuffer { return &capBuffer{max: max} }

func (c *capBuffer) Write(p []byte) {
	c.total += int64(len(p))
	if room := c.max - int64(c.buf.Len()); c.max <= 0 || room > 0 {
		if c.max > 0 && int64(len(p)) > room {
			p = p[:room]
		}
		c.buf.Write(p)
	}
}

func (c *capBuffer) String() string  { return c.buf.String() }
func (c *capBuffer) Total() int64    { return c.total }
func (c *capBuffer) Truncated() bool { return c.total > int64(c.buf.Len()) }

// ReadFile reads up to max bytes at offset of path in sandbox id.
func (m *Manager) ReadFile(ctx context.Context, id, path string, offset, max int64) (*agent.FileData, error) {
	sb, caps, err := m.live(ctx, id, CapFiles)
	if err != nil {
		return nil, err
	}
	if !caps.Agent {
		return m.guestReadFile(ctx, sb, path, offset, max)
	}
	m.touch(sb)
	d, err := sb.agent.ReadFile(ctx, path, offset, max)
	if err != nil {
		return nil, m.agentError(sb, err, "read file")
	}
	return d, nil
}

// WriteFile writes content to a file in sandbox id.
func (m *Manager) WriteFile(ctx context.Context, id string, req agent.WriteFileRequest, content io.Reader) (*agent.FileInfo, error) {
	sb, caps, err := m.live(ctx, id, CapFiles)
	if err != nil {
		return nil, err
	}
	if !caps.Agent {
		return m.guestWriteFile(ctx, sb, req, content)
	}
	m.touch(sb)
	fi, err := sb.agent.WriteFile(ctx, req, content)
	if err != nil {
		return nil, m.agentError(sb, err, "write file")
	}
	return fi, nil
}

// ListFiles lists path in sandbox id.
func (m *Manager) ListFiles(ctx context.Context, id, path string, recursive bool) ([]agent.FileInfo, error) {
	sb, _, err := m.live(ctx, id, CapFileList)
	if err != nil {
		return nil, err
	}
	m.touch(sb)
	l, err := sb.agent.ListFiles(ctx, path, recursive)
	if err != nil {
		return nil, m.agentError(sb, err, "list files")
	}
	return l, nil
}

// StatFile describes path in sandbox id without following a final
// symlink (the agent's stat; the SSH endpoint's SFTP server needs it).
func (m *Manager) StatFile(ctx context.Context, id, path string) (*agent.FileInfo, error) {
	sb, _, err := m.live(ctx, id, CapFileList)
	if err != nil {
		return nil, err
	}
	m.touch(sb)
	fi, err := sb.agent.Stat(ctx, path)
	if err != nil {
		return nil, m.agentError(sb, err, "stat file")
	}
	return fi, nil
}

// ListFilesMax lists path in sandbox id up to max entries, with how many
// there are (agent.Client.ListFilesMax).
func (m *Manager) ListFilesMax(ctx context.Context, id, path string, recursive bool, max int) (*agent.FileList, error) {
	sb, _, err := m.live(ctx, id, CapFileList)
	if err != nil {
		return nil, err
	}
	m.touch(sb)
	l, err := sb.agent.ListFilesMax(ctx, path, recursive, max)
	if err != nil {
		return nil, m.agentError(sb, err, "list files")
	}
	return l, nil
}

// DeleteFile deletes path in sandbox id.
func (m *Manager) DeleteFile(ctx context.Context, id, path string, recursive bool) error {
	sb, _, err := m.live(ctx, id, CapFileList)
	if err != nil {
		return err
	}
	m.touch(sb)
	if err := sb.agent.DeleteFile(ctx, path, recursive); err != nil {
		return m.agentError(sb, err, "delete file")
	}
	return nil
}

// lookupFor is lookup for an operation needing capability want: a sandbox
// whose handle lacks it is refused (unavailable, naming the sandbox and the
// capability) before anything is dialled. It also returns the handle's
// capabilities, which tell the caller which agent serves the operation.
func (m *Manager) lookupFor(ctx context.Context, id string, want Capability) (*Sandbox, Capabilities, error) {
	sb, err := m.lookup(ctx, id)
	if err != nil {
		return nil, Capabilities{}, err
	}
	caps, err := sb.require(want)
	if err != nil {
		return nil, caps, err
	}
	return sb, caps, nil
}

// live returns sandbox id if it accepts work needing capability want (ready
// or running, and its handle has want), with its capabilities.
func (m *Manager) live(ctx context.Context, id string, want Capability) (*Sandbox, Capabilities, error) {
	sb, caps, err := m.lookupFor(ctx, id, want)
	if err != nil {
		return nil, caps, err
	}
	if err := sb.acceptsWork(); err != nil {
		return nil, caps, err
	}
	return sb, caps, nil
}

// acceptsWork says why the sandbox takes no work now (not ready or running,
// terminating, being restored), or nil.
func (sb *Sandbox) acceptsWork() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.terminating || !(sb.state == StateReady || sb.state == StateRunning) {
		return errdefs.Conflictf("sandbox %s is %s", sb.ID, sb.stateNameLocked())
	}
	if sb.busy == busyRestore {
		return errdefs.Conflictf("sandbox %s is being restored from a snapshot", sb.ID)
	}
	return nil
}

// oomKills counts the OOM killer's kills in the sandbox so far.
func (sb *Sandbox) oomKills() (uint64, error) {
	sb.mu.Lock()
	h := sb.handle
	sb.mu.Unlock()
	if h == nil {
		return 0, errors.New("sandbox not started")
	}
	return h.OOMKills()
}
