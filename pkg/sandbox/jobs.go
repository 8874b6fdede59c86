package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// jobMeta is what the daemon remembers about a command it started; the agent
// keeps the rest (output, exit status) so it survives a daemon restart.
type jobMeta struct {
	oomBefore uint64
}

// startCommand starts spec in sb through the agent after beginCommand; the
// caller owns one endCommand.
// With hold, the agent keeps all output until the caller attaches.
// With openStdin (no tty), the command's stdin is a pipe an interactive
// session writes to and closes.
func (m *Manager) startCommand(ctx context.Context, sb *Sandbox, spec ExecSpec, tty *agent.TTYSize, hold, openStdin bool) (string, error) {
	oomBefore, _ := sb.oomKills()
	jobID, err := sb.agent.Start(ctx, m.execRequest(sb, spec, tty, hold, openStdin))
	if err != nil {
		return "", m.agentError(sb, err, "start command")
	}
	sb.addJob(jobID, oomBefore)
	return jobID, nil
}

// execRequest is the agent's request for spec.
func (m *Manager) execRequest(sb *Sandbox, spec ExecSpec, tty *agent.TTYSize, hold, openStdin bool) agent.ExecRequest {
	cwd := spec.Cwd
	if cwd == "" {
		cwd = sb.spec.WorkDir
	}
	if cwd == "" {
		cwd = "/workspace"
	}
	gid := spec.UID
	return agent.ExecRequest{
		Argv: spec.Argv, Env: sb.env(spec.Env), Cwd: cwd, Stdin: spec.Stdin,
		TimeoutMS: spec.Timeout.Milliseconds(), OutputLimit: m.opt.OutputLimit, UID: spec.UID, GID: gid, TTY: tty,
		HoldOutput: hold, OpenStdin: openStdin && tty == nil,
	}
}

// addJob records a job the daemon started, with the sandbox's OOM kill
// count before it.
func (sb *Sandbox) addJob(jobID string, oomBefore uint64) {
	sb.mu.Lock()
	if sb.jobs == nil {
		sb.jobs = map[string]jobMeta{}
	}
	sb.jobs[jobID] = jobMeta{oomBefore: oomBefore}
	sb.mu.Unlock()
}

func (sb *Sandbox) jobMeta(jobID string) jobMeta {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.jobs[jobID]
}

// publishOutput forwards output to event subscribers, if there are any.
func (m *Manager) publishOutput(sb *Sandbox, jobID string, c agent.Chunk) {
	if m.events.active() {
		m.events.publish(Event{Type: "output", SandboxID: sb.ID, Tenant: sb.owner(), JobID: jobID, Stream: c.Stream, Data: string(c.Data)})
	}
}

// StartJob starts a command in the background and returns its job id at
// once; JobStatus pages its output and reports its outcome.
func (m *Manager) StartJob(ctx context.Context, id string, spec ExecSpec) (string, error) {
	sb, _, err := m.lookupFor(ctx, id, CapJobs)
	if err != nil {
		return "", err
	}
	if err := m.beginCommand(ctx, sb); err != nil {
		return "", err
	}
	jobID, err := m.startCommand(ctx, sb, spec, nil, false, false)
	if err != nil {
		m.endCommand(sb)
		return "", err
	}
	go m.watchJob(sb, jobID, 0, 0)
	return jobID, nil
}

// watchJob follows a job until it ends (publishing its output) and then
// releases its hold on the running state.
func (m *Manager) watchJob(sb *Sandbox, jobID string, stdoutOff, stderrOff int64) {
	defer m.endCommand(sb)
	_, err := sb.agent.Attach(context.Background(), jobID, stdoutOff, stderrOff, func(c agent.Chunk) error {
		m.publishOutput(sb, jobID, c)
		return nil
	})
	if err != nil {
		sb.mu.Lock()
		terminating := sb.terminating
		sb.mu.Unlock()
		if !terminating {
			m.log.Warn("lost track of a background job", "sandbox", sb.ID, "job", jobID, "err", err)
		}
	}
}

// JobStatus is a background job's state and output since given offsets.
type JobStatus = apitypes.JobStatus

// JobStatus reads up to max bytes per stream of a job's output after the
// given offsets, without waiting.
func (m *Manager) JobStatus(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64, max int) (*JobStatus, error) {
	sb, _, err := m.live(ctx, id, CapJobs)
	if err != nil {
		return nil, err
	}
	r, err := sb.agent.Read(ctx, jobID, stdoutOff, stderrOff, max)
	if err != nil {
		return nil, m.agentError(sb, err, "read job")
	}
	st := &JobStatus{
		JobID: jobID, State: "running", Stdout: string(r.Stdout), Stderr: string(r.Stderr),
		StdoutOffset: r.StdoutOffset, StderrOffset: r.StderrOffset,
		NextStdoutOffset: r.NextStdoutOffset, NextStderrOffset: r.NextStderrOffset,
	}
	if r.Exit != nil {
		st.State = "finished"
		t := m.termination(sb, r.Exit, sb.jobMeta(jobID).oomBefore)
		code := r.Exit.ExitCode
		st.ExitCode, st.Termination, st.DurationMS = &code, &t, r.Exit.DurationMS
	}
	return st, nil
}

// KillJob sends signal (default SIGKILL) to a job's process group.
func (m *Manager) KillJob(ctx context.Context, id, jobID, signal string) error {
	sb, _, err := m.live(ctx, id, CapJobs)
	if err != nil {
		return err
	}
	if signal == "" {
		signal = "SIGKILL"
	}
	if err := sb.agent.Signal(ctx, jobID, signal); err != nil {
		return m.agentError(sb, err, "signal job")
	}
	return nil
}

// Jobs lists the commands the sandbox's agent knows about.
func (m *Manager) Jobs(ctx context.Context, id string) ([]agent.JobInfo, error) {
	sb, _, err := m.live(ctx, id, CapJobs)
	if err != nil {
		return nil, err
	}
	jobs, err := sb.agent.Jobs(ctx)
	if err != nil {
		return nil, m.agentError(sb, err, "list jobs")
	}
	return jobs, nil
}

// TerminalSpec is an interactive command on a pseudo-terminal, or with
// Pipes on an open stdin pipe with stdout and stderr kept apart.
type TerminalSpec struct {
	Argv       []string
	Env        map[string]string
	Cwd        string
	Rows, Cols uint16
	// Pipes runs the command without a terminal (the E2B front end's
	// processes): Rows and Cols are ignored and CloseStdin gives it EOF.
	Pipes bool
	// UID runs the command as this user (0 only in a root-mode sandbox);
	// nil is the sandbox user.
	UID *int
	// Timeout kills the command after this long; 0: none.
	Timeout time.Duration
}

// Terminal is an interactive command on a pseudo-terminal in a sandbox.
type Terminal struct {
	m       *Manager
	sb      *Sandbox
	JobID   string
	sess    *agent.Session
	chunks  chan agent.Chunk
	started time.Time
	endOnce sync.Once
	outOnce sync.Once
	out     chan []byte
}

// OpenTerminal starts spec on a new pseudo-terminal in sandbox id.
func (m *Manager) OpenTerminal(ctx context.Context, id string, spec TerminalSpec) (*Terminal, error) {
	sb, _, err := m.lookupFor(ctx, id, CapPTY)
	if err != nil {
		return nil, err
	}
	// Security boundary: uid 0 is root inside the sandbox's own user
	// namespace only in root mode; elsewhere it would be the host's root.
	if spec.UID != nil && *spec.UID != sb.spec.UID && !sb.spec.Root {
		return nil, errdefs.Invalidf("user: sandbox %s runs only as its own user (it was not created in root mode)", id)
	}
	if err := m.beginCommand(ctx, sb); err != nil {
		return nil, err
	}
	env := map[string]string{}
	tty := &agent.TTYSize{Rows: spec.Rows, Cols: spec.Cols}
	if spec.Pipes {
		tty = nil
	} else {
		env["TERM"] = "xterm-256color"
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	// With Pipes the agent holds the output until the session attaches: a
	// fast command's first bytes must not leave the retained tail before.
	jobID, err := m.startCommand(ctx, sb, ExecSpec{Argv: spec.Argv, Env: env, Cwd: spec.Cwd, UID: spec.UID, Timeout: spec.Timeout}, tty, spec.Pipes, spec.Pipes)
	if err != nil {
		m.endCommand(sb)
		return nil, err
	}
	// The session outlives this call's context: it lasts as long as the terminal.
	sess, err := sb.agent.Interactive(context.WithoutCancel(ctx), jobID)
	if err != nil {
		kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = sb.agent.Signal(kctx, jobID, "SIGKILL")
		cancel()
		m.endCommand(sb)
		return nil, m.agentError(sb, err, "attach terminal")
	}
	return m.newTerminal(sb, jobID, sess), nil
}

// newTerminal follows an interactive session on sb's job jobID.
func (m *Manager) newTerminal(sb *Sandbox, jobID string, sess *agent.Session) *Terminal {
	t := &Terminal{m: m, sb: sb, JobID: jobID, sess: sess, chunks: make(chan agent.Chunk, 16), started: time.Now()}
	go func() {
		defer close(t.chunks)
		for c := range sess.Output() {
			m.publishOutput(sb, jobID, c)
			t.chunks <- c
		}
	}()
	return t
}

// AttachTerminal takes over a running interactive command (one with a
// terminal or an open stdin) of sandbox id, its output from the given
// offsets: how a front end that lost its session, say in a daemon
// restart, follows the command again. Closing the terminal kills it.
func (m *Manager) AttachTerminal(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64) (*Terminal, error) {
	sb, _, err := m.lookupFor(ctx, id, CapPTY)
	if err != nil {
		return nil, err
	}
	if err := m.beginCommand(ctx, sb); err != nil {
		return nil, err
	}
	sess, err := sb.agent.InteractiveFrom(context.WithoutCancel(ctx), jobID, stdoutOff, stderrOff)
	if err != nil {
		m.endCommand(sb)
		return nil, m.agentError(sb, err, "attach to job "+jobID)
	}
	return m.newTerminal(sb, jobID, sess), nil
}

// Output delivers what the terminal prints; it is closed when the command
// ends. Use either Output or Chunks.
func (t *Terminal) Output() <-chan []byte {
	t.outOnce.Do(func() {
		t.out = make(chan []byte, 16)
		go func() {
			defer close(t.out)
			for c := range t.chunks {
				t.out <- c.Data
			}
		}()
	})
	return t.out
}

// Chunks delivers the command's output with its stream (stdout, or stderr
// with Pipes); it is closed when the command ends. Use either Output or
// Chunks.
func (t *Terminal) Chunks() <-chan agent.Chunk { return t.chunks }

// CloseStdin closes the command's stdin (with Pipes) or sends the
// terminal's end-of-file character.
func (t *Terminal) CloseStdin() error {
	if err := t.sess.CloseStdin(); err != nil {
		return t.m.agentError(t.sb, err, "close stdin")
	}
	return nil
}

// Write sends keyboard input.
func (t *Terminal) Write(p []byte) (int, error) { return t.sess.Write(p) }

// Resize changes the terminal's size.
func (t *Terminal) Resize(rows, cols uint16) error {
	if err := t.sess.Resize(rows, cols); err != nil {
		return t.m.agentError(t.sb, err, "resize terminal")
	}
	return nil
}

// Wait blocks until the command ends (Output must be drained) and returns
// its outcome; the output itself went through Output.
func (t *Terminal) Wait() (*ExecResult, error) {
	exit, err := t.sess.Wait()
	t.end()
	if err != nil {
		return &ExecResult{JobID: t.JobID, ExitCode: -1, DurationMS: time.Since(t.started).Milliseconds(),
			Termination: t.m.lostTermination(t.sb, t.sb.jobMeta(t.JobID).oomBefore, err)}, nil
	}
	return &ExecResult{JobID: t.JobID, ExitCode: exit.ExitCode, DurationMS: exit.DurationMS,
		StdoutBytes: exit.StdoutBytes, Termination: t.m.termination(t.sb, exit, t.sb.jobMeta(t.JobID).oomBefore),
		Usage: jobUsage(exit), BlockedSyscalls: blockedSyscalls(t.sb, t.JobID)}, nil
}

// Close ends the terminal, killing its command if it is still running.
func (t *Terminal) Close() error {
	kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := t.sb.agent.Read(kctx, t.JobID, 0, 0, 0); err == nil && st.Exit == nil {
		_ = t.sb.agent.Signal(kctx, t.JobID, "SIGKILL")
	}
	err := t.sess.Close()
	t.end()
	return err
}

func (t *Terminal) end() {
	t.endOnce.Do(func() { t.m.endCommand(t.sb) })
}
