//go:build cgo

package userns

/*
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

// sandboxd_userns_owner forks a child that becomes uid:gid (no
// supplementary groups) and only then unshares a user namespace, so that
// uid, not root, owns the namespace, and waits to be killed. The child runs
// async-signal-safe libc calls only (it is a fork of a multi-threaded Go
// process) and never returns into Go; it reports on syncfd: one zero byte
// once the namespace exists, or the errno of the step that failed.
//
// A fork without exec inherits every descriptor of the daemon (its
// listeners, its database, its state lock, sandboxes' seccomp listeners):
// the child keeps only syncfd (moved to 3) and /dev/null as 0-2 before
// anything else. Its parent-death signal is set after the last change of
// credentials (setresuid, and unshare, which installs new credentials),
// because a change of credentials clears it (prctl(2)), and a parent that
// died before that is caught by comparing getppid with the forking pid.
static int sandboxd_userns_owner(unsigned int uid, unsigned int gid, int syncfd, int nullfd) {
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	// Fresh copies at 3 and above first, so that no dup2 below can
	// overwrite the other descriptor wherever the daemon had them.
	int s = fcntl(syncfd, F_DUPFD, 3), n = fcntl(nullfd, F_DUPFD, 3);
	if (s < 0 || n < 0 || dup2(n, 0) < 0 || dup2(n, 1) < 0 || dup2(n, 2) < 0 || (s != 3 && dup2(s, 3) < 0))
		_exit(1);
	if (syscall(SYS_close_range, 4U, ~0U, 0U) < 0) {
		// Before Linux 5.9 (the daemon needs 5.19 for user namespaces
		// anyway): close one by one.
		long max = sysconf(_SC_OPEN_MAX);
		for (long fd = 4; fd < max; fd++)
			close(fd);
	}
	unsigned char e = 0;
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0 ||
	    unshare(CLONE_NEWUSER) < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		e = errno ? errno : 255;
	if (getppid() != parent)
		_exit(1);
	if (write(3, &e, 1) != 1 || e != 0)
		_exit(1);
	for (;;)
		pause();
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
)

// CrashOwnerAlive is the crash point (internal/crashpoint) at which the
// namespace's owner process exists and the daemon has not yet killed it:
// a daemon dying here must not leave it behind.
const CrashOwnerAlive = "userns-owner-alive"

// NamespaceFD returns an open user namespace (an nsfs file) with mapping m,
// owned by host uid m.HostID.
//
// The owner matters: the kernel counts per-user limits of a namespace's
// users (inotify instances and watches, user namespaces, mqueue bytes) at
// every level up to the host's, where they land on the namespace's owner.
// A namespace created by root, as runc creates one, would make every
// sandbox share root's count (one sandbox holding 128 inotify instances
// would starve all others, and the host's root). Owned by m.HostID, each
// sandbox has counts of its own.
//
// A forked child (C, before any Go runs in it) drops to m.HostID and
// unshares; the daemon, root on the host, writes the mapping (only a
// privileged parent may map a whole range), opens the namespace and kills
// the child. The namespace lives on while the file (or a bind mount of it,
// or any process in it) holds it.
func NamespaceFD(m IDMap) (*os.File, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	r, w := os.NewFile(uintptr(p[0]), "sync"), os.NewFile(uintptr(p[1]), "sync")
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	pid, errno := C.sandboxd_userns_owner(C.uint(m.HostID), C.uint(m.HostID), C.int(p[1]), C.int(null.Fd()))
	w.Close()
	null.Close()
	if pid < 0 {
		return nil, fmt.Errorf("user namespace: fork: %w", errno)
	}
	defer func() {
		_ = unix.Kill(int(pid), unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != unix.EINTR {
				break
			}
		}
	}()
	b := make([]byte, 1)
	if n, err := r.Read(b); n != 1 {
		return nil, fmt.Errorf("user namespace: the child died before it unshared: %v", err)
	}
	if b[0] != 0 {
		return nil, fmt.Errorf("user namespace owned by %d: %w", m.HostID, syscall.Errno(b[0]))
	}
	crashpoint.Hit(CrashOwnerAlive)
	proc := "/proc/" + strconv.Itoa(int(pid))
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(proc+"/"+f, []byte(m.String()), 0); err != nil {
			return nil, fmt.Errorf("user namespace %s: write %s: %w", m, f, err)
		}
	}
	f, err := os.Open(proc + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("open user namespace %s: %w", m, err)
	}
	return f, nil
}
