package server

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// defaultEnv is the environment of a command whose request gives none.
var defaultEnv = []string{"PATH=" + defaultPath, "HOME=/home/sandbox", "LANG=C.UTF-8"}

// childFDs are the descriptors a command gets as 0, 1 and 2, plus the
// parent's ends of them.
type childFDs struct {
	child   [3]int     // closed in the parent once the child has started
	readers []*os.File // stdout, stderr (or the pty master)
	stdin   *os.File   // pipe write end or pty master, or nil
	pty     *os.File
}

// closeChild closes the child's descriptors; for a tty they are all the
// same slave descriptor, closed once.
func (c *childFDs) closeChild() {
	for i, fd := range c.child {
		if fd < 0 || (i > 0 && fd == c.child[i-1]) {
			continue
		}
		unix.Close(fd)
	}
}

// closeParent closes the agent's ends after a failed start.
func (c *childFDs) closeParent() {
	for _, f := range c.readers {
		f.Close()
	}
	if c.stdin != nil && c.stdin != c.pty {
		c.stdin.Close()
	}
}

// start validates req and starts it as a new job.
func (t *jobTable) start(req *agent.ExecRequest, stdin []byte) (*job, error) {
	argv0, env, cwd, cred, err := t.prepare(req)
	if err != nil {
		return nil, err
	}
	fds, err := openFDs(req, len(stdin) > 0)
	if err != nil {
		return nil, err
	}
	return t.launch(req, argv0, env, cwd, cred, fds, stdin, false)
}

// launch starts a prepared command on fds as a new job; sudo marks one
// started for a sudo client (sudo.go).
func (t *jobTable) launch(req *agent.ExecRequest, argv0 string, env []string, cwd string, cred *syscall.Credential, fds *childFDs, stdin []byte, sudo bool) (*job, error) {
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{uintptr(fds.child[0]), uintptr(fds.child[1]), uintptr(fds.child[2])},
		Sys: &syscall.SysProcAttr{
			// Own session and process group, so that timeouts and kills
			// reach everything the command starts.
			Setsid:     true,
			Setctty:    req.TTY != nil,
			Ctty:       0,
			Credential: cred,
		},
	}
	j := t.newJob(req, fds, sudo)
	var failed atomic.Bool
	onExit := func(ws unix.WaitStatus, ru *unix.Rusage) {
		if !failed.Load() {
			j.onExit(ws, ru)
		}
	}
	j.startedAt = time.Now()
	pid, err := t.startOnSpareIfReady(j, argv0, req.Argv, env, cwd, cred, fds, onExit)
	if errors.Is(err, errSpareGone) {
		pid, err = t.startDirect(j, argv0, req.Argv, attr, cred, fds, onExit, &failed)
	} else if err != nil {
		failed.Store(true)
	}
	fds.closeChild()
	if err != nil {
		fds.closeParent()
		if j.cg != nil {
			_ = j.cg.kill()
			_ = j.cg.remove()
		}
		return nil, execError(argv0, cwd, err)
	}
	t.run(j, req, pid, stdin)
	t.log.Info("job started", "job", j.id, "pid", pid, "argv0", argv0, "uid", credUID(cred), "tty", j.tty)
	return j, nil
}

// newJob is the job a launch starts, before it has a process.
func (t *jobTable) newJob(req *agent.ExecRequest, fds *childFDs, sudo bool) *job {
	j := &job{
		id:          newJobID(),
		argv:        req.Argv,
		tty:         req.TTY != nil,
		openStdin:   req.OpenStdin,
		outputLimit: req.OutputLimit,
		timeout:     time.Duration(req.TimeoutMS) * time.Millisecond,
		table:       t,
		readers:     fds.readers,
		readersDone: make(chan struct{}),
		pty:         fds.pty,
		stdin:       fds.stdin,
		changed:     make(chan struct{}),
		sudo:        sudo,
	}
	for i := range j.streams {
		j.streams[i].retain = t.opts.RetainBytes
	}
	return j
}

// run follows a started job: output held for the daemon to attach if
// asked, the job in the table, its readers, its stdin and its timeout.
func (t *jobTable) run(j *job, req *agent.ExecRequest, pid int, stdin []byte) {
	if req.HoldOutput {
		// Before the readers start, so no byte can be dropped before the
		// daemon attaches.
		j.held = j.follow([2]int64{0, 0})
		j.unheld = make(chan struct{})
		j.awaited.Store(true)
		j.holdOf = new(atomic.Pointer[job])
		j.holdOf.Store(j)
		holdOf := j.holdOf // not j: see job.holdOf
		j.mu.Lock()        // the timer's function takes it too
		j.holdTimer = time.AfterFunc(agent.HoldGrace, func() {
			if j := holdOf.Load(); j != nil {
				j.mu.Lock()
				j.releaseHeld()
				j.mu.Unlock()
			}
		})
		j.mu.Unlock()
	}
	// Added before the readers start: the job cannot finish before that.
	t.add(j)
	if t.cgroups == nil {
		// Make the OOM killer pick the command rather than the agent (the
		// job-exec helper does it itself when there is one). Raising the
		// score needs no privilege, writing another uid's file does;
		// failure only costs that preference.
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(oomScoreAdj), 0)
	}

	var wg sync.WaitGroup
	for i, f := range j.readers {
		wg.Add(1)
		go j.readLoop(i, f, &wg)
	}
	go func() { wg.Wait(); close(j.readersDone) }()
	if len(stdin) > 0 {
		go func() {
			if err := j.writeStdin(stdin); err != nil {
				t.log.Debug("stdin not fully written", "job", j.id, "err", err)
			}
			if !req.OpenStdin && !j.tty {
				j.closeStdin()
			}
		}()
	}
	if j.timeout > 0 {
		j.mu.Lock()
		j.timer = time.AfterFunc(j.timeout, func() {
			j.kill(agent.CauseTimeout, fmt.Sprintf("killed after the %s timeout", j.timeout))
		})
		j.mu.Unlock()
	}
}

// startOnSpareIfReady starts the command on the ready spare (spare.go):
// errSpareGone when there is none or it cannot take this command.
func (t *jobTable) startOnSpareIfReady(j *job, argv0 string, argv, env []string, cwd string, cred *syscall.Credential, fds *childFDs, onExit exitFunc) (int, error) {
	if t.cgroups == nil {
		return 0, errSpareGone
	}
	c := t.jobCreds(cred)
	spec := (&spareSpec{Path: argv0, Argv: argv, Env: env, Dir: cwd, UID: c.uid, GID: c.gid, KeepCaps: c.keepCaps, TTY: j.tty}).encode()
	if len(spec) > spareMaxSpec || len(argv) > spareMaxStrings || len(env) > spareMaxStrings {
		t.prepareSpare()
		return 0, errSpareGone
	}
	s := t.takeSpare()
	if s == nil {
		return 0, errSpareGone
	}
	j.id, j.cg, j.pid = s.id, s.cg, s.pid
	err := t.startOnSpare(s, spec, fds.child, onExit)
	if errors.Is(err, errSpareGone) {
		// Its exit (or kill) removes the cgroup; the direct path makes its own.
		j.id, j.cg, j.pid = newJobID(), nil, 0
	}
	return s.pid, err
}

// startDirect forks the command: through the job-exec helper into a new
// job cgroup when jobs have cgroups, else straight.
func (t *jobTable) startDirect(j *job, argv0 string, argv []string, attr *syscall.ProcAttr, cred *syscall.Credential, fds *childFDs, onExit exitFunc, failed *atomic.Bool) (int, error) {
	forkExec := func() (int, error) { return syscall.ForkExec(argv0, argv, attr) }
	var status *os.File // the job-exec helper's status pipe
	if t.cgroups != nil {
		t.sweepLingering()
		var err error
		if j.cg, err = t.cgroups.create(j.id); err != nil {
			return 0, err
		}
		r, w, err := os.Pipe()
		if err != nil {
			return 0, fmt.Errorf("status pipe: %w", err)
		}
		status = r
		defer r.Close()
		attr.Files = append(attr.Files, w.Fd())
		// The helper switches credentials after entering the cgroup, then
		// enters the working directory as the job's user.
		attr.Sys.Credential = nil
		cwd := attr.Dir
		attr.Dir = ""
		hargv := helperArgv(t.self, t.jobCreds(cred), cwd, j.cg.procsFiles(), argv0, argv)
		forkExec = func() (int, error) {
			defer w.Close()
			return syscall.ForkExec(t.self, hargv, attr)
		}
	}
	// j.pid is set under the reaper's lock, so onExit sees it.
	pid, err := t.reaper.spawn(func() (int, error) {
		pid, err := forkExec()
		j.pid = pid
		return pid, err
	}, onExit)
	if err == nil && status != nil {
		if err = helperStatus(status); err != nil {
			failed.Store(true)
		}
	}
	return pid, err
}

// jobCreds is who a job started through the helper runs as: cred, or
// the agent's own identity without one. Only jobs as uid 0 of a root-mode
// agent (default user 0, or RootMode) keep the capability bounding set.
func (t *jobTable) jobCreds(cred *syscall.Credential) jobCreds {
	c := jobCreds{uid: os.Geteuid(), gid: os.Getegid()}
	if cred != nil {
		c.uid, c.gid = int(cred.Uid), int(cred.Gid)
	}
	c.keepCaps = c.uid == 0 && (t.opts.UID == 0 || t.opts.RootMode)
	return c
}

func credUID(c *syscall.Credential) int {
	if c == nil {
		return os.Geteuid()
	}
	return int(c.Uid)
}

// execError classifies a fork/exec failure.
func execError(argv0, cwd string, err error) error {
	if errors.Is(err, unix.E2BIG) {
		return agent.Errorf(errdefs.InvalidArgument, "argv and environment too large for %s: %v", argv0, err)
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOEXEC) {
		return agent.Errorf(errdefs.InvalidArgument, "cannot execute %s in %s: %v", argv0, cwd, err)
	}
	return fmt.Errorf("start %s: %w", argv0, err)
}

// prepare validates req and works out the executable, environment, working
// directory and credentials.
func (t *jobTable) prepare(req *agent.ExecRequest) (argv0 string, env []string, cwd string, cred *syscall.Credential, err error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "empty argv")
	}
	for _, s := range append(append([]string(nil), req.Argv...), req.Env...) {
		if strings.IndexByte(s, 0) >= 0 {
			return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "argv or env contains NUL")
		}
	}
	if req.TimeoutMS < 0 || req.OutputLimit < 0 {
		return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "negative timeout or output limit")
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "terminal size %dx%d", req.TTY.Rows, req.TTY.Cols)
	}

	env = req.Env
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "env entry %q is not K=V", kv)
		}
	}
	if len(env) == 0 {
		env = append([]string(nil), defaultEnv...)
	}
	if req.TTY != nil && lookupEnv(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}

	cwd = req.Cwd
	switch {
	case cwd == "":
		cwd = "/"
		if fi, err := os.Stat("/workspace"); err == nil && fi.IsDir() {
			cwd = "/workspace"
		}
	case !path.IsAbs(cwd) || path.Clean(cwd) != cwd:
		return "", nil, "", nil, agent.Errorf(errdefs.InvalidArgument, "cwd %q is not an absolute clean path", cwd)
	}

	argv0, err = lookPath(req.Argv[0], env)
	if err != nil {
		return "", nil, "", nil, err
	}
	cred, err = t.credential(req)
	return argv0, env, cwd, cred, err
}

// credential returns the identity the command runs as. Switching to a
// non-zero uid clears every capability; the supplementary groups are reset
// to the command's gid so none of the agent's groups leak.
func (t *jobTable) credential(req *agent.ExecRequest) (*syscall.Credential, error) {
	uid, gid := t.opts.UID, t.opts.GID
	if req.UID != nil {
		uid = *req.UID
	}
	if req.GID != nil {
		gid = *req.GID
	}
	if uid < 0 || gid < 0 || uid > 1<<31-2 || gid > 1<<31-2 {
		return nil, agent.Errorf(errdefs.InvalidArgument, "invalid uid/gid %d/%d", uid, gid)
	}
	if os.Geteuid() != 0 {
		// Unprivileged (tests on the host): only our own identity works.
		if uid != os.Geteuid() || gid != os.Getegid() {
			return nil, agent.Errorf(errdefs.InvalidArgument, "agent is not root: cannot run as %d:%d", uid, gid)
		}
		return nil, nil
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{uint32(gid)}}, nil
}

func lookupEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath resolves name through the PATH of env. Names containing a slash
// are used as they are (relative ones against the command's cwd).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	p := lookupEnv(env, "PATH")
	if p == "" {
		p = defaultPath
	}
	for _, dir := range strings.Split(p, ":") {
		if !path.IsAbs(dir) {
			continue // a relative PATH entry would depend on the cwd
		}
		cand := path.Join(dir, name)
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", agent.Errorf(errdefs.NotFound, "executable %q not found in PATH", name)
}

// openFDs creates the command's stdio: a pseudo-terminal, or pipes for
// stdout and stderr and, when there is input or an open stdin is asked
// for, stdin (else /dev/null).
func openFDs(req *agent.ExecRequest, haveStdin bool) (*childFDs, error) {
	if req.TTY != nil {
		master, slave, err := openPTY(req.TTY)
		if err != nil {
			return nil, err
		}
		return &childFDs{child: [3]int{slave, slave, slave}, readers: []*os.File{master}, stdin: master, pty: master}, nil
	}
	c := &childFDs{child: [3]int{-1, -1, -1}}
	fail := func(err error) (*childFDs, error) {
		c.closeChild()
		c.closeParent()
		return nil, err
	}
	if haveStdin || req.OpenStdin {
		r, w, err := pipe()
		if err != nil {
			return fail(err)
		}
		c.child[0] = r
		if c.stdin, err = parentFile(w, "stdin"); err != nil {
			return fail(err)
		}
	} else {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open /dev/null: %w", err))
		}
		c.child[0] = fd
	}
	for i, name := range streamNames {
		r, w, err := pipe()
		if err != nil {
			return fail(err)
		}
		c.child[i+1] = w
		f, err := parentFile(r, name)
		if err != nil {
			return fail(err)
		}
		c.readers = append(c.readers, f)
	}
	return c, nil
}

// pipe returns a close-on-exec pipe as (read end, write end).
func pipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, fmt.Errorf("pipe: %w", err)
	}
	return p[0], p[1], nil
}

// parentFile wraps the agent's end of a pipe. Making it non-blocking first
// lets os.File use the poller, so reads honour deadlines; the child's end
// stays blocking, as programs expect.
func parentFile(fd int, name string) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set %s non-blocking: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openPTY opens a pseudo-terminal of the given size and returns the
// agent's master (non-blocking, wrapped) and the child's slave fd.
func openPTY(size *agent.TTYSize) (*os.File, int, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(err error) (*os.File, int, error) {
		unix.Close(m)
		return nil, -1, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
	if err != nil {
		return fail(fmt.Errorf("get pty number: %w", err))
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	s, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open %s: %w", name, err))
	}
	if err := unix.IoctlSetWinsize(s, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols}); err != nil {
		unix.Close(s)
		return fail(fmt.Errorf("set terminal size: %w", err))
	}
	if err := unix.SetNonblock(m, true); err != nil {
		unix.Close(s)
		return fail(fmt.Errorf("set pty non-blocking: %w", err))
	}
	return os.NewFile(uintptr(m), "/dev/ptmx"), s, nil
}
