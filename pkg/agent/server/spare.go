package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A spare is a job-exec helper started ahead of its job: forked, already a
// member of a fresh job cgroup, waiting on a socket for the command to
// become. Moving a task into a cgroup takes the kernel's
// cgroup_threadgroup_rwsem for writing, and the first writer after a quiet
// spell waits for an RCU grace period (1–22 ms measured on this project's
// hosts, longer under load, for every hierarchy alike) — most of what an
// exec of `true` would cost. The spare pays that between commands; the
// command's start is a message, setsid'd already, dup2, setuid and exec.
//
// Security boundary: the spare is the agent binary running only our code
// (the C helper, jobexec.c: no Go runtime starts in it), as root with the
// agent's capabilities, until it drops to the command's credentials exactly
// as the helper of a direct start does.
// It reads its command only from its end of a socketpair the agent made;
// nothing in the sandbox can reach that socket (it is no path and no
// inherited descriptor of any command: both ends are close-on-exec).
//
// One spare exists at a time per agent; it costs one process and one pid
// of the sandbox's while idle (about 0.1 MiB charged to the sandbox, where
// a Go spare cost 0.85: docs/ARCHITECTURE.md). Commands whose request is too large for one message, and
// commands started while the spare is being prepared, take the direct path.

// SpareArg is the first argument that makes the agent binary wait as a
// spare job-exec helper.
const SpareArg = "__job-spare"

// spareMaxSpec bounds the command message and spareMaxStrings its argv
// and its environment (SPEC_MAX and SPEC_MAX_STRINGS in jobexec.c); larger
// ones start directly.
const (
	spareMaxSpec    = 64 << 10
	spareMaxStrings = 8192
)

// spareReady is the spare's one message once it sits in its cgroups.
const spareReady = "ready"

// spareSpec is the command a spare becomes.
type spareSpec struct {
	Path string
	Argv []string
	Env  []string
	Dir  string
	UID  int
	GID  int
	// KeepCaps keeps the bounding set (jobCreds.keepCaps).
	KeepCaps bool
	TTY      bool // descriptor 0 is a terminal to make the controlling one
}

// encode is the spare's command message, NUL-separated strings the C
// helper (jobexec.c) splits without a parser of its own:
//
//	uid gid keep(0|1) tty(0|1) dir path argc argv... envc env...
//
// The strings were checked for NULs (prepare); the helper refuses a
// message that does not split exactly so, or whose Dir is not absolute.
func (s *spareSpec) encode() []byte {
	b01 := func(v bool) string {
		if v {
			return "1"
		}
		return "0"
	}
	fields := []string{strconv.Itoa(s.UID), strconv.Itoa(s.GID), b01(s.KeepCaps), b01(s.TTY), s.Dir, s.Path, strconv.Itoa(len(s.Argv))}
	fields = append(fields, s.Argv...)
	fields = append(fields, strconv.Itoa(len(s.Env)))
	fields = append(fields, s.Env...)
	n := 0
	for _, f := range fields {
		n += len(f) + 1
	}
	out := make([]byte, 0, n)
	for _, f := range fields {
		out = append(append(out, f...), 0)
	}
	return out
}

// spare is the agent's side of one spare helper.
type spare struct {
	id  string // the job id its cgroup is named after
	pid int
	cg  *jobCgroup
	ctl *os.File // the agent's end of the SOCK_SEQPACKET pair

	mu     sync.Mutex
	onExit exitFunc // the job's, once one takes the spare
	dead   bool     // exited before a job took it
}

// exited is the reaper's callback for the spare's pid.
func (s *spare) exited(t *jobTable) exitFunc {
	return func(ws unix.WaitStatus, ru *unix.Rusage) {
		s.mu.Lock()
		fn := s.onExit
		s.dead = fn == nil
		s.mu.Unlock()
		if fn != nil {
			fn(ws, ru)
			return
		}
		s.ctl.Close()
		t.linger(s.cg)
	}
}

// claim hands the spare's exit to onExit; false if it already died.
func (s *spare) claim(onExit exitFunc) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return false
	}
	s.onExit = onExit
	return true
}

// takeSpare returns the ready spare, if any, and starts preparing the next.
func (t *jobTable) takeSpare() *spare {
	t.spareMu.Lock()
	s := t.spare
	t.spare = nil
	t.spareMu.Unlock()
	t.prepareSpare()
	return s
}

// prepareSpare starts a spare in the background unless one is ready or on
// its way. Failures are logged and leave commands on the direct path.
func (t *jobTable) prepareSpare() {
	if t.cgroups == nil || t.self == "" {
		return
	}
	t.spareMu.Lock()
	if t.spare != nil || t.preparing || t.closed {
		t.spareMu.Unlock()
		return
	}
	t.preparing = true
	t.spareMu.Unlock()
	go func() {
		s, err := t.startSpare()
		t.spareMu.Lock()
		t.preparing = false
		if err == nil && t.closed {
			err = fmt.Errorf("agent closing")
			s.ctl.Close() // the spare reads EOF and exits
		} else if err == nil {
			t.spare = s
		}
		t.spareMu.Unlock()
		if err != nil {
			t.log.Debug("no spare job helper", "err", err)
		}
	}()
}

// startSpare forks a spare into a fresh job cgroup and waits until it is in.
func (t *jobTable) startSpare() (*spare, error) {
	t.sweepLingering()
	s := &spare{id: newJobID()}
	var err error
	if s.cg, err = t.cgroups.create(s.id); err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		_ = s.cg.remove()
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// The agent's end is served by Go's poller: waiting for the spare's
	// "ready" and for its status then holds no OS thread of the agent
	// (each thread it ever made stays, idle, as memory of the sandbox).
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		_ = s.cg.remove()
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	s.ctl = os.NewFile(uintptr(fds[0]), "spare")
	child := fds[1]
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(child)
		s.ctl.Close()
		_ = s.cg.remove()
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Files: []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(child)},
		// Its own session from the start: the command leads it.
		Sys: &syscall.SysProcAttr{Setsid: true},
	}
	argv := []string{t.self, SpareArg, strings.Join(s.cg.procsFiles(), ",")}
	s.pid, err = t.reaper.spawn(func() (int, error) { return syscall.ForkExec(t.self, argv, attr) }, s.exited(t))
	unix.Close(child)
	unix.Close(null)
	if err != nil {
		s.ctl.Close()
		_ = s.cg.remove()
		return nil, fmt.Errorf("start spare: %w", err)
	}
	buf := make([]byte, 512)
	n, err := s.ctl.Read(buf)
	if err != nil || string(buf[:n]) != spareReady {
		// It failed (its message says why) or died; its exit removes the cgroup.
		s.ctl.Close()
		_ = unix.Kill(s.pid, unix.SIGKILL)
		return nil, fmt.Errorf("spare helper: %q %v", buf[:n], err)
	}
	return s, nil
}

// startOnSpare makes spare s run the command. fds are the command's 0, 1, 2.
// It returns once the command runs or its exec failed.
func (t *jobTable) startOnSpare(s *spare, spec []byte, fds [3]int, onExit exitFunc) error {
	if !s.claim(onExit) {
		return errSpareGone
	}
	if err := unix.Sendmsg(int(s.ctl.Fd()), spec, unix.UnixRights(fds[:]...), nil, 0); err != nil {
		s.mu.Lock()
		s.onExit = nil
		s.mu.Unlock()
		_ = unix.Kill(s.pid, unix.SIGKILL)
		s.ctl.Close()
		return errSpareGone
	}
	defer s.ctl.Close()
	return helperStatus(s.ctl)
}

// errSpareGone says the spare was not used: start the command directly.
var errSpareGone = fmt.Errorf("spare job helper gone")
