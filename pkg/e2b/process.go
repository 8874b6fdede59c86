package e2b

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb/process"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// keepExited is how long a finished process stays known, so that a late
// Connect still gets its end (envd keeps them too).
const keepExited = time.Minute

// defaultKeepalive is the keepalive interval when the client names none.
const defaultKeepalive = 90 * time.Second

// proc is one process started through envd's Start. Its output is pumped
// from the agent session to every connected stream; a stream that goes
// away leaves the process running.
type proc struct {
	sandbox string
	pid     uint32
	tag     string
	cfg     *process.ProcessConfig
	pty     bool
	p       Process

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *process.ProcessEvent // the end event once it has ended
}

type subscriber struct {
	ch   chan *process.ProcessEvent
	gone chan struct{}
}

// processes indexes the processes by sandbox and pid.
type processes struct {
	mu sync.Mutex
	m  map[string]map[uint32]*proc
}

func newProcesses() *processes { return &processes{m: map[string]map[uint32]*proc{}} }

func (ps *processes) add(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m[p.sandbox] == nil {
		ps.m[p.sandbox] = map[uint32]*proc{}
	}
	ps.m[p.sandbox][p.pid] = p
}

func (ps *processes) remove(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m[p.sandbox][p.pid] == p {
		delete(ps.m[p.sandbox], p.pid)
	}
}

// find returns the process sel names in sandbox id.
func (ps *processes) find(id string, sel *process.ProcessSelector) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch {
	case sel == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process: a selector (pid or tag) is required"))
	case sel.GetTag() != "":
		for _, p := range ps.m[id] {
			if p.tag == sel.GetTag() && p.ended() == nil {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", sel.GetTag()))
	}
	if p := ps.m[id][sel.GetPid()]; p != nil {
		return p, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", sel.GetPid()))
}

func (ps *processes) list(id string) []*proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*proc
	for _, p := range ps.m[id] {
		if p.ended() == nil {
			out = append(out, p)
		}
	}
	return out
}

// dropSandbox forgets a killed sandbox's processes.
func (ps *processes) dropSandbox(id string) {
	ps.mu.Lock()
	procs := ps.m[id]
	delete(ps.m, id)
	ps.mu.Unlock()
	for _, p := range procs {
		_ = p.p.Close()
	}
}

func (ps *processes) closeAll() {
	ps.mu.Lock()
	ids := make([]string, 0, len(ps.m))
	for id := range ps.m {
		ids = append(ids, id)
	}
	ps.mu.Unlock()
	for _, id := range ids {
		ps.mu.Lock()
		procs := ps.m[id]
		delete(ps.m, id)
		ps.mu.Unlock()
		for _, p := range procs {
			// Detach only: the commands keep running in their sandboxes.
			if p.ended() == nil {
				p.detach()
			}
		}
	}
}

func (p *proc) ended() *process.ProcessEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

// detach stops following the process without killing it.
func (p *proc) detach() {
	if d, ok := p.p.(interface{ Detach() error }); ok {
		_ = d.Detach()
	}
}

func (p *proc) subscribe() *subscriber {
	sub := &subscriber{ch: make(chan *process.ProcessEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		sub.ch <- p.end
		return sub
	}
	p.subs[sub] = struct{}{}
	return sub
}

func (p *proc) unsubscribe(sub *subscriber) {
	close(sub.gone)
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
}

func (p *proc) broadcast(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for sub := range p.subs {
		subs = append(subs, sub)
	}
	p.mu.Unlock()
	for _, sub := range subs {
		select {
		case sub.ch <- ev:
		case <-sub.gone:
		}
	}
}

// pump forwards output until the process ends, then its end.
func (ps *processes) pump(p *proc) {
	for c := range p.p.Chunks() {
		d := &process.ProcessEvent_DataEvent{}
		switch {
		case p.pty:
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: c.Data}
		case c.Stream == agent.StreamStderr:
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: c.Data}
		default:
			d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: c.Data}
		}
		p.broadcast(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
	}
	res, err := p.p.Wait()
	end := endEvent(res, err)
	ev := &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
	p.mu.Lock()
	p.end = ev
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	for sub := range subs {
		select {
		case sub.ch <- ev:
		case <-sub.gone:
		}
	}
	time.AfterFunc(keepExited, func() { ps.remove(p) })
}

// endEvent is envd's end of a process: exited with a code, or ended by a
// signal (exit code -1, as Go's os.ProcessState reports it).
func endEvent(res *apitypes.ExecResult, err error) *process.ProcessEvent_EndEvent {
	if err != nil || res == nil {
		msg := "lost track of the process"
		if err != nil {
			msg = errdefs.MessageOf(err)
		}
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "unknown", Error: &msg}
	}
	t := res.Termination
	switch t.Cause {
	case apitypes.CauseExited:
		return &process.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: true, Status: "exit status " + strconv.Itoa(res.ExitCode)}
	case apitypes.CauseSignal, apitypes.CauseKilled, apitypes.CauseTimeout, apitypes.CauseOOM, apitypes.CauseOutputLimit:
		status := "signal: " + signalText(t.Signal)
		e := &process.ProcessEvent_EndEvent{ExitCode: -1, Status: status}
		if t.Cause != apitypes.CauseSignal && t.Cause != apitypes.CauseKilled {
			msg := t.Cause
			if t.Detail != "" {
				msg += ": " + t.Detail
			}
			e.Error = &msg
		}
		return e
	}
	msg := t.Cause
	if t.Detail != "" {
		msg += ": " + t.Detail
	}
	return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "unknown", Error: &msg}
}

// signalText is Go's (and so envd's) description of a signal.
func signalText(sig string) string {
	switch strings.TrimPrefix(strings.ToUpper(sig), "SIG") {
	case "KILL", "":
		return "killed"
	case "TERM":
		return "terminated"
	case "INT":
		return "interrupt"
	case "HUP":
		return "hangup"
	case "QUIT":
		return "quit"
	case "PIPE":
		return "broken pipe"
	case "SEGV":
		return "segmentation fault"
	case "ABRT":
		return "aborted"
	}
	return strings.ToLower(sig)
}

// processService is envd's process.Process.
type processService struct{ s *Server }

// procEnv is the environment of a command of user: envd's (HOME, USER,
// LOGNAME), E2B's markers, then the request's.
func procEnv(c *envdCall, user string, envs map[string]string) map[string]string {
	env := map[string]string{"HOME": home(user), "USER": user, "LOGNAME": user,
		"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": c.e2bID, "E2B_TEMPLATE_ID": c.sb.Labels[labelTemplate]}
	for k, v := range envs {
		env[k] = v
	}
	return env
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	c := callOf(ctx)
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: required"))
	}
	// A name execve cannot carry (empty, with '=' or NUL) or a value with
	// NUL is refused here, naming it, rather than reaching the sandbox
	// (found by FuzzEnvdRPC).
	for k, v := range cfg.GetEnvs() {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process.envs: %q is not a valid environment variable", k))
		}
	}
	cwd := home(c.user)
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		var err error
		if cwd, err = resolve(c.user, cfg.GetCwd()); err != nil {
			return connectErr(err)
		}
	}
	pr := apitypes.ProcessRequest{SandboxID: c.sb.ID, Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env: procEnv(c, c.user, cfg.GetEnvs()), Cwd: cwd, Root: c.user == userRoot}
	// envd kills a command when the request's Connect-Timeout-Ms passes,
	// whether or not its client is still there (a client times out the
	// request at the same moment and goes away): the agent's own timeout
	// does it, on the command's whole process group.
	if ms, err := strconv.ParseInt(req.Header().Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		pr.TimeoutSeconds = float64(ms) / 1000
	}
	if pty := req.Msg.GetPty(); pty != nil {
		pr.TTY = true
		pr.Rows, pr.Cols = uint16(min(pty.GetSize().GetRows(), 1000)), uint16(min(pty.GetSize().GetCols(), 1000))
	}
	p, err := ps.s.b.OpenProcess(context.WithoutCancel(ctx), pr)
	if err != nil {
		return connectErr(err)
	}
	// envd's stdin defaults to open (old SDKs); the SDKs send false unless
	// asked, and then the command reads end-of-file as from /dev/null.
	if !pr.TTY && req.Msg.Stdin != nil && !req.Msg.GetStdin() {
		_ = p.CloseStdin()
	}
	pid := ps.s.pidOf(ctx, c.sb.ID, p.JobID())
	pp := &proc{sandbox: c.sb.ID, pid: pid, tag: req.Msg.GetTag(), cfg: cfg, pty: pr.TTY, p: p, subs: map[*subscriber]struct{}{}}
	sub := pp.subscribe()
	ps.s.procs.add(pp)
	go ps.s.procs.pump(pp)
	start := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
	return follow(ctx, req.Header(), sub, pp, start, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	}, func() {
		// Connect-Timeout-Ms ran out: envd kills the command.
		kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = ps.s.b.KillJob(kctx, apitypes.JobKillRequest{SandboxID: pp.sandbox, JobID: p.JobID(), Signal: "SIGKILL"})
	})
}

// pidOf is the command's pid in the sandbox, as its agent reports it.
func (s *Server) pidOf(ctx context.Context, id, jobID string) uint32 {
	jobs, err := s.b.ListJobs(ctx, id)
	if err == nil {
		for _, j := range jobs {
			if j.ID == jobID && j.PID > 0 {
				return uint32(j.PID)
			}
		}
	}
	// The agent knows every job it started; should it not say, a number
	// above any pid (Linux's pid_max is at most 2^22) keeps the processes
	// apart.
	return 1<<22 + s.pidSeq.Add(1)
}

// follow sends start, then the process's events until its end, with
// keepalives in silences. A client that leaves does not end the process;
// onDeadline runs when the request's deadline passes first.
func follow(ctx context.Context, h interface{ Get(string) string }, sub *subscriber, p *proc, start *process.ProcessEvent,
	send func(*process.ProcessEvent) error, onDeadline func()) error {
	defer p.unsubscribe(sub)
	if err := send(start); err != nil {
		return err
	}
	every := defaultKeepalive
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		every = time.Duration(n) * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
			t.Reset(every)
		case <-t.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				if onDeadline != nil {
					onDeadline()
				}
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout passed; it was killed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	c := callOf(ctx)
	p, err := ps.s.findProc(ctx, c.sb.ID, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe()
	start := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}
	return follow(ctx, req.Header(), sub, p, start, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	}, nil)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	c := callOf(ctx)
	out := &process.ListResponse{}
	followed := map[string]bool{}
	for _, p := range ps.s.procs.list(c.sb.ID) {
		info := &process.ProcessInfo{Config: p.cfg, Pid: p.pid}
		if p.tag != "" {
			tag := p.tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
		followed[p.p.JobID()] = true
	}
	// The sandbox's other running commands too, as envd lists every
	// process it started: those this front end started before a daemon
	// restart (Connect takes them over by pid), and those of the other
	// front ends.
	jobs, err := ps.s.b.ListJobs(ctx, c.sb.ID)
	if err != nil {
		return nil, connectErr(err)
	}
	for _, j := range jobs {
		if j.State != "running" || followed[j.ID] || len(j.Argv) == 0 || j.PID <= 0 {
			continue
		}
		out.Processes = append(out.Processes, &process.ProcessInfo{Pid: uint32(j.PID), Config: &process.ProcessConfig{Cmd: j.Argv[0], Args: j.Argv[1:]}})
	}
	return connect.NewResponse(out), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	c := callOf(ctx)
	p, err := ps.s.findProc(ctx, c.sb.ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.ended() != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	}
	in := req.Msg.GetInput()
	data := in.GetStdin()
	if in.GetPty() != nil {
		data = in.GetPty()
	}
	if len(data) > 0 {
		if _, err := p.p.Write(data); err != nil {
			return nil, connectErr(err)
		}
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	c := callOf(ctx)
	p, err := ps.s.findProc(ctx, c.sb.ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.ended() != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	}
	sig := "SIGKILL"
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal: %v is not SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	if _, err := ps.s.b.KillJob(ctx, apitypes.JobKillRequest{SandboxID: c.sb.ID, JobID: p.p.JobID(), Signal: sig}); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	c := callOf(ctx)
	p, err := ps.s.findProc(ctx, c.sb.ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process: a terminal has no stdin to close (send Ctrl+D, 0x04)"))
	}
	if err := p.p.CloseStdin(); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	c := callOf(ctx)
	p, err := ps.s.findProc(ctx, c.sb.ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if !p.pty {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("pty: the process has no terminal"))
		}
		if sz.GetRows() == 0 || sz.GetCols() == 0 || sz.GetRows() > 1000 || sz.GetCols() > 1000 {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size: %dx%d is not 1 to 1000 rows and columns", sz.GetCols(), sz.GetRows()))
		}
		if err := p.p.Resize(uint16(sz.GetRows()), uint16(sz.GetCols())); err != nil {
			return nil, connectErr(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (ps *processService) StreamInput(context.Context, *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("StreamInput is not served (the SDKs use SendInput)"))
}

// findProc returns the process sel names in sandbox id, taking over by pid
// a running command this front end does not follow (adopt).
func (s *Server) findProc(ctx context.Context, id string, sel *process.ProcessSelector) (*proc, error) {
	p, err := s.procs.find(id, sel)
	if err == nil || sel.GetPid() == 0 || connect.CodeOf(err) != connect.CodeNotFound {
		return p, err
	}
	// One adoption at a time: two requests for the same pid must not both
	// attach.
	s.adoptMu.Lock()
	defer s.adoptMu.Unlock()
	if p, err := s.procs.find(id, sel); err == nil {
		return p, nil
	}
	if p := s.adopt(ctx, id, sel.GetPid()); p != nil {
		return p, nil
	}
	return nil, err
}

// adopt follows the running command with pid in sandbox id, its output from
// where it stands: one this front end started before the daemon restarted
// (the agent kept it running; the table of followed processes was in
// memory). Only commands with a terminal or an open stdin, as envd's are,
// can be taken over; nil when there is none with that pid.
func (s *Server) adopt(ctx context.Context, id string, pid uint32) *proc {
	jobs, err := s.b.ListJobs(ctx, id)
	if err != nil {
		return nil
	}
	for _, j := range jobs {
		if j.PID <= 0 || uint32(j.PID) != pid || j.State != "running" || len(j.Argv) == 0 {
			continue
		}
		p, err := s.b.AttachProcess(context.WithoutCancel(ctx), id, j.ID, j.StdoutBytes, j.StderrBytes)
		if err != nil {
			s.log.Debug("e2b: cannot take over command", "sandbox", id, "job", j.ID, "err", err)
			return nil
		}
		pp := &proc{sandbox: id, pid: pid, cfg: &process.ProcessConfig{Cmd: j.Argv[0], Args: j.Argv[1:]}, pty: j.TTY, p: p, subs: map[*subscriber]struct{}{}}
		s.procs.add(pp)
		go s.procs.pump(pp)
		s.log.Info("e2b: took over a running command", "sandbox", id, "pid", pid, "job", j.ID)
		return pp
	}
	return nil
}
