// Package lifetime says which processes of the daemon die with it and which
// outlive it, and finds what an earlier daemon left behind.
//
// Every daemon process carries a marker in the environment it was executed
// with: SANDBOXD_DAEMON=<state dir>. /proc/PID/environ shows that
// environment, and every child inherits it: a fork without exec (the user
// namespace owner), and every helper started with the daemon's environment
// (image builders, mkfs, QEMU probes). A process that must outlive the
// daemon (a sandbox's init and agent, which libcontainer starts with an
// environment of its own; QEMU and swtpm of a VM, started with Unmarked)
// does not carry it. So a process that carries the marker of a state
// directory and is not the daemon holding that directory's lock is a
// leftover of a dead daemon, whatever its name, and a restarting daemon
// ends it before it takes the lock (Sweep).
//
// Processes meant to die with the daemon also get a parent-death signal
// (SIGKILL), set after their last change of credentials (such a change
// clears it), so that in the normal case nothing is left for Sweep.
package lifetime

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MarkerVar is the environment variable that marks the daemon's processes;
// its value is the daemon's state directory.
const MarkerVar = "SANDBOXD_DAEMON"

// Marker is the environment entry that marks the processes of the daemon
// of stateDir.
func Marker(stateDir string) string { return MarkerVar + "=" + filepath.Clean(stateDir) }

// Unmarked returns env without the marker: the environment of a process
// that is meant to outlive the daemon (and is adopted by the next one), so
// that Sweep leaves it alone.
func Unmarked(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, MarkerVar+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// Inherit returns env plus the current process's marker, if it has one:
// the environment of a helper that must die with the daemon but is started
// with an environment of its own.
func Inherit(env []string) []string {
	if v, ok := os.LookupEnv(MarkerVar); ok {
		return append(Unmarked(env), MarkerVar+"="+v)
	}
	return env
}

// EnsureMarked re-executes the current process (same pid, arguments and
// descriptors) with the marker of stateDir in its environment, unless it
// carries it already. Setting the variable in-process would not do: the
// kernel shows, and a fork inherits, the environment of the last execve.
// It returns only on error, or when nothing needed doing.
func EnsureMarked(stateDir string) error {
	if os.Getenv(MarkerVar) == filepath.Clean(stateDir) {
		return nil
	}
	env := append(Unmarked(os.Environ()), Marker(stateDir))
	return fmt.Errorf("re-execute with %s: %w", MarkerVar, unix.Exec("/proc/self/exe", os.Args, env))
}

// CloseInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own descriptors so, but those the daemon inherited (from a
// shell, a test harness's flock, a service manager) would otherwise pass on
// to every helper and every QEMU it starts, and outlive the daemon there.
func CloseInheritedOnExec() error {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	// Before Linux 5.11: one by one.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	return nil
}

// DieWithParent is the SysProcAttr of a helper that must not outlive the
// daemon: SIGKILL when the daemon's thread that started it dies. Go sets it
// in the child after any credential change and checks that the parent did
// not die before (syscall.forkAndExecInChild). The signal follows the
// thread, not the process: Go ends a thread only when a goroutine exits
// while locked to it, which the daemon does only to discard a thread whose
// network namespace could not be restored; a helper that thread started
// earlier would die with it, failing its operation rather than outliving
// anything.
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// Marked reports whether process pid carries the marker of stateDir and is
// alive (not a zombie).
func Marked(pid int, stateDir string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	if _, state, ok := stat(pid); !ok || state == 'Z' || state == 'X' {
		return false
	}
	m := []byte(Marker(stateDir))
	for _, kv := range bytes.Split(env, []byte{0}) {
		if bytes.Equal(kv, m) {
			return true
		}
	}
	return false
}

// StateDirOf returns the state directory named by process pid's marker,
// "" if it carries none (or is gone). It names the owner of a host-wide
// name in an error (pkg/hostclaim); it proves nothing, as the marker is
// an environment variable any process may set.
func StateDirOf(pid int) string {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(MarkerVar+"=")); ok {
			return string(v)
		}
	}
	return ""
}

// Daemon reports whether pid is a live daemon of stateDir: marked, and
// root's (the marker alone is an environment variable any user may set on
// a process of theirs; that must not keep the daemon from starting).
func Daemon(pid int, stateDir string) bool {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid), &st); err != nil || st.Uid != 0 {
		return false
	}
	return Marked(pid, stateDir)
}

// Leftovers lists the live processes, other than the caller, that carry
// the marker of stateDir and started before the caller (a daemon starting
// at the same moment is not an earlier one's leftover), minus those keep
// accepts.
func Leftovers(stateDir string, keep func(pid int) bool) []int {
	self := os.Getpid()
	myStart, _, ok := stat(self)
	if !ok {
		return nil
	}
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self || !Marked(pid, stateDir) {
			continue
		}
		if start, _, ok := stat(pid); !ok || start > myStart {
			continue
		}
		if keep != nil && keep(pid) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// Sweep kills (SIGKILL) the Leftovers of stateDir and waits up to timeout
// until they are gone; it returns the pids it killed. A process that dies
// becomes a zombie of its (new) parent and holds nothing any more.
func Sweep(stateDir string, keep func(pid int) bool, timeout time.Duration) ([]int, error) {
	pids := Leftovers(stateDir, keep)
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		var alive []int
		for _, pid := range pids {
			if Marked(pid, stateDir) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			return pids, nil
		}
		if time.Now().After(deadline) {
			return pids, fmt.Errorf("processes of an earlier mcp-sandboxd still alive %s after SIGKILL: %v", timeout, alive)
		}
	}
}

// InCgroup reports whether pid's cgroup (in any hierarchy) is parent or
// lies under it.
func InCgroup(pid int, parent string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.LastIndexByte(line, ':'); i >= 0 {
			if p := line[i+1:]; p == parent || strings.HasPrefix(p, parent+"/") {
				return true
			}
		}
	}
	return false
}

// LockHolders lists the live processes, other than the caller, that may
// hold a lock on the file f: those /proc/locks names and those with f
// open. /proc/locks names the process that took a flock, which may be long
// dead while a child that inherited its descriptor keeps the lock.
func LockHolders(f *os.File) []int {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil
	}
	self := os.Getpid()
	seen := map[int]bool{}
	add := func(pid int) {
		if _, state, ok := stat(pid); ok && state != 'Z' && pid != self {
			seen[pid] = true
		}
	}
	if data, err := os.ReadFile("/proc/locks"); err == nil {
		id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
		for _, line := range strings.Split(string(data), "\n") {
			fs := strings.Fields(line)
			// "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END"; a
			// waiter has "->" after the number.
			if len(fs) < 6 || fs[1] == "->" || fs[5] != id {
				continue
			}
			if pid, err := strconv.Atoi(fs[4]); err == nil {
				add(pid)
			}
		}
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, p := range fds {
		var fst unix.Stat_t
		if unix.Stat(p, &fst) != nil || fst.Dev != st.Dev || fst.Ino != st.Ino {
			continue
		}
		if pid, err := strconv.Atoi(strings.Split(p, "/")[2]); err == nil {
			add(pid)
		}
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// stat returns pid's start time (clock ticks since boot) and state letter.
func stat(pid int) (start uint64, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	fs := strings.Fields(string(b[i+2:]))
	// fs[0] is field 3 (state); starttime is field 22.
	if len(fs) < 20 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(fs[19], 10, 64)
	return start, fs[0][0], err == nil
}
