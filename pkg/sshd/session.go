package sshd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// exitLost is the exit status of a session whose command's outcome is
// unknown (the sandbox ended under it, or the command could not start):
// OpenSSH's own status for "the connection failed".
const exitLost = 255

// session is one "session" channel: a shell, a command or the sftp
// subsystem, run through the engine.
type session struct {
	c  *conn
	ch ssh.Channel

	mu      sync.Mutex
	env     map[string]string
	pty     *ptyRequest
	proc    Process
	started bool
	fin     sync.Once
}

type ptyRequest struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

type windowChange struct {
	Cols, Rows    uint32
	Width, Height uint32
}

// allowedEnv says whether a client may set variable name (OpenSSH's
// SendEnv/SetEnv): locale, terminal and time zone, as Debian's sshd
// AcceptEnv does. Anything else (PATH, LD_PRELOAD, ...) stays the sandbox's.
func allowedEnv(name string) bool {
	switch name {
	case "LANG", "LANGUAGE", "TERM", "COLORTERM", "TZ":
		return true
	}
	return strings.HasPrefix(name, "LC_") && len(name) > 3 && len(name) <= 32 &&
		strings.Trim(name[3:], "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == ""
}

// signals are the RFC 4254 signal names a client may send a command.
var signals = map[string]bool{"ABRT": true, "ALRM": true, "FPE": true, "HUP": true, "ILL": true, "INT": true,
	"KILL": true, "PIPE": true, "QUIT": true, "SEGV": true, "TERM": true, "USR1": true, "USR2": true}

func (c *conn) session(nc ssh.NewChannel) {
	if !c.reserve() {
		// Refused at the open, so the client says why ("open failed").
		_ = nc.Reject(ssh.ResourceShortage, fmt.Sprintf("mcp-sandboxd: at most %d sessions per connection", maxSessions))
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		c.unreserve()
		return
	}
	s := &session{c: c, ch: ch, env: map[string]string{}}
	if !c.add(s) {
		c.mu.Lock()
		why := c.ended
		c.mu.Unlock()
		s.fin.Do(func() { s.end(exitLost, why) })
		return
	}
	defer c.remove(s)
	for r := range reqs {
		s.handle(r)
	}
	// The client closed the channel: a command still running is killed,
	// as sshd's SIGHUP would end it.
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		_ = p.Close()
	}
}

// stderr tells the client something, on the channel's stderr (shown by
// ssh whatever the command prints).
func (s *session) stderr(format string, args ...any) {
	_, _ = fmt.Fprintf(s.ch.Stderr(), "mcp-sandboxd: "+format+"\r\n", args...)
}

func (s *session) handle(r *ssh.Request) {
	ok := false
	switch r.Type {
	case "env":
		var kv struct{ Name, Value string }
		if ssh.Unmarshal(r.Payload, &kv) == nil && allowedEnv(kv.Name) && len(kv.Value) <= 4096 && !strings.ContainsRune(kv.Value, 0) {
			s.mu.Lock()
			if !s.started {
				s.env[kv.Name], ok = kv.Value, true
			}
			s.mu.Unlock()
		}
	case "pty-req":
		var p ptyRequest
		if ssh.Unmarshal(r.Payload, &p) == nil {
			s.mu.Lock()
			if !s.started {
				s.pty, ok = &p, true
			}
			s.mu.Unlock()
		}
	case "window-change":
		var w windowChange
		if ssh.Unmarshal(r.Payload, &w) == nil {
			s.mu.Lock()
			p, pty := s.proc, s.pty
			if pty != nil {
				pty.Cols, pty.Rows = w.Cols, w.Rows
			}
			s.mu.Unlock()
			if p != nil && pty != nil {
				ok = p.Resize(clamp16(w.Rows), clamp16(w.Cols)) == nil
			}
		}
	case "signal":
		var sig struct{ Signal string }
		if ssh.Unmarshal(r.Payload, &sig) == nil && signals[sig.Signal] {
			s.mu.Lock()
			p := s.proc
			s.mu.Unlock()
			if p != nil {
				_, err := s.c.s.b.KillJob(s.c.ctx, apitypes.JobKillRequest{SandboxID: s.c.login.sandboxID, JobID: p.JobID(), Signal: "SIG" + sig.Signal})
				ok = err == nil
			}
		}
	case "shell":
		ok = s.start(shellArgv("-l"))
	case "exec":
		var cmd struct{ Command string }
		if ssh.Unmarshal(r.Payload, &cmd) == nil {
			// As sshd does: the user's shell runs the line.
			ok = s.start(shellArgv("-c", cmd.Command))
		}
	case "subsystem":
		var sub struct{ Name string }
		if ssh.Unmarshal(r.Payload, &sub) == nil {
			if sub.Name == "sftp" {
				ok = s.startSFTP()
			} else {
				s.stderr("subsystem %q is not offered (only sftp)", sub.Name)
			}
		}
	case "auth-agent-req@openssh.com":
		s.c.log.Warn("ssh agent forwarding refused")
		s.stderr("agent forwarding is refused: a sandbox must not use your keys")
	case "x11-req":
		s.c.log.Warn("ssh X11 forwarding refused")
		s.stderr("X11 forwarding is refused: sandboxes have no display to forward")
	}
	if r.WantReply {
		_ = r.Reply(ok, nil)
	}
}

// shellArgv runs bash with args where the image has it (every language
// image), else the POSIX shell (a minimal VM guest's busybox). The command
// line travels as $0 of the probe, never spliced into its text.
func shellArgv(args ...string) []string {
	probe := `if [ -x /bin/bash ]; then exec /bin/bash "$@"; else exec /bin/sh "$@"; fi`
	return append([]string{"/bin/sh", "-c", probe, "sh"}, args...)
}

func clamp16(v uint32) uint16 {
	if v > 0xffff {
		return 0xffff
	}
	return uint16(v)
}

// claim marks the session as running something; a second shell, exec or
// subsystem on one channel is refused, as sshd does.
func (s *session) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return false
	}
	s.started = true
	return true
}

// start runs argv in the sandbox through the engine, on a pseudo-terminal
// when the client asked for one, and relays it until it ends.
func (s *session) start(argv []string) bool {
	if !s.claim() {
		return false
	}
	s.mu.Lock()
	req := apitypes.ProcessRequest{SandboxID: s.c.login.sandboxID, Argv: argv, Env: s.env, Root: s.c.login.root}
	if s.pty != nil {
		req.TTY, req.Rows, req.Cols = true, clamp16(s.pty.Rows), clamp16(s.pty.Cols)
		if req.Rows == 0 || req.Cols == 0 {
			req.Rows, req.Cols = 24, 80
		}
		if t := s.pty.Term; t != "" && len(t) <= 64 && !strings.ContainsAny(t, "\x00\n") {
			req.Env["TERM"] = t
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.c.ctx, time.Minute)
	p, err := s.c.s.b.OpenProcess(ctx, req)
	cancel()
	if err != nil {
		// The request succeeds and the session says why it ends: a
		// failed exec request would only make ssh print "exec request
		// failed".
		s.c.log.Info("ssh session refused", "err", err)
		go s.finish(exitLost, errdefs.MessageOf(err))
		return true
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	go s.pumpStdin(p)
	go s.pumpOutput(p)
	return true
}

// pumpStdin copies the client's input to the command; the client's EOF
// closes the command's stdin (on a terminal: the EOF character).
func (s *session) pumpStdin(p Process) {
	if _, err := io.Copy(processWriter{p}, s.ch); err == nil {
		_ = p.CloseStdin()
	}
}

type processWriter struct{ p Process }

func (w processWriter) Write(b []byte) (int, error) { return w.p.Write(b) }

func (s *session) pumpOutput(p Process) {
	for c := range p.Chunks() {
		if c.Stream == agent.StreamStderr {
			_, _ = s.ch.Stderr().Write(c.Data)
		} else {
			_, _ = s.ch.Write(c.Data)
		}
	}
	res, err := p.Wait()
	switch {
	case err != nil:
		s.finish(exitLost, errdefs.MessageOf(err))
	case res.Termination.Cause == apitypes.CauseLost || res.Termination.Detail == "sandbox terminated":
		msg := res.Termination.Detail
		if msg == "" {
			msg = "the command's outcome was lost"
		}
		s.finish(exitLost, msg)
	case res.Termination.Cause == apitypes.CauseTimeout || res.Termination.Cause == apitypes.CauseOOM || res.Termination.Cause == apitypes.CauseOutputLimit:
		s.finish(exitCode(res.ExitCode), res.Termination.Detail)
	default:
		s.finish(exitCode(res.ExitCode), "")
	}
}

func exitCode(c int) uint32 {
	if c < 0 || c > 255 {
		return exitLost
	}
	return uint32(c)
}

// finish ends the session once: why (when set) on stderr, the exit status,
// EOF and close.
func (s *session) finish(code uint32, why string) {
	s.fin.Do(func() { s.end(code, why) })
}

func (s *session) end(code uint32, why string) {
	if why != "" {
		s.stderr("%s", why)
	}
	_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
	_ = s.ch.CloseWrite()
	_ = s.ch.Close()
}
