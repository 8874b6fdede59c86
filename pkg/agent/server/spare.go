package server

import (
	"encoding/json"
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
// Security boundary: the spare is the agent binary running only our code,
// as root with the agent's capabilities, until it drops to the command's
// credentials exactly as the helper of a direct start does (jobexec.go).
// It reads its command only from its end of a socketpair the agent made;
// nothing in the sandbox can reach that socket (it is no path and no
// inherited descriptor of any command: both ends are close-on-exec).
//
// One spare exists at a time per agent; it costs one process (a few MiB of
// the sandbox's memory and a handful of its pids, charged like any job's)
// while idle. Commands whose request is too large for one message, and
// commands started while the spare is being prepared, take the direct path.

// SpareArg is the first argument that makes the agent binary wait as a
// spare job-exec helper.
const SpareArg = "__job-spare"

// spareMaxSpec bounds the command message; larger ones start directly.
const spareMaxSpec = 64 << 10

// spareReady is the spare's one message once it sits in its cgroups.
const spareReady = "ready"

// spareSpec is the command a spare becomes.
type spareSpec struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	UID  int      `json:"uid"`
	GID  int      `json:"gid"`
	// KeepCaps keeps the bounding set (jobCreds.keepCaps).
	KeepCaps bool `json:"keep_caps,omitempty"`
	TTY      bool `json:"tty"` // descriptor 0 is a terminal to make the controlling one
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
		Env:   []string{"GOMAXPROCS=1"},
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

// runSpare is the spare's side (see MaybeJobExec): enter the cgroups, say
// so, wait for the command, become it.
func runSpare(procs string) {
	lockMainThread()
	ctl := 3
	unix.CloseOnExec(ctl)
	fail := func(errno syscall.Errno, format string, a ...any) {
		_, _ = unix.Write(ctl, []byte(strconv.Itoa(int(errno))+" "+fmt.Sprintf(format, a...)))
		os.Exit(127)
	}
	if procs != "" {
		for _, f := range strings.Split(procs, ",") {
			if err := os.WriteFile(f, []byte("0"), 0); err != nil {
				fail(errnoOf(err), "enter job cgroup: %v", err)
			}
		}
	}
	if _, err := unix.Write(ctl, []byte(spareReady)); err != nil {
		os.Exit(127)
	}
	buf := make([]byte, spareMaxSpec)
	oob := make([]byte, unix.CmsgSpace(3*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(ctl, buf, oob, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || n == 0 {
		os.Exit(0) // the agent let it go
	}
	var spec spareSpec
	if err := json.Unmarshal(buf[:n], &spec); err != nil {
		fail(syscall.EINVAL, "command message: %v", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		fail(syscall.EINVAL, "command descriptors: %v", err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 3 {
		fail(syscall.EINVAL, "command descriptors: %d, %v", len(got), err)
	}
	// The received descriptors are above 3 (0–2 are /dev/null), so the
	// dups cannot clobber one another.
	for i, fd := range got {
		if err := unix.Dup3(fd, i, 0); err != nil {
			fail(errnoOf(err), "dup: %v", err)
		}
	}
	for _, fd := range got {
		if fd > 2 {
			unix.Close(fd)
		}
	}
	if spec.TTY {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			fail(errnoOf(err), "controlling terminal: %v", err)
		}
	}
	becomeAndExec(jobCreds{uid: spec.UID, gid: spec.GID, keepCaps: spec.KeepCaps}, spec.Dir, spec.Path, spec.Argv, spec.Env, fail)
}
