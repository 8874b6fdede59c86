//go:build cgo

package userns

/*
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

// sandboxd_userns_owner forks a child that becomes uid:gid (no
// supplementary groups) and only then unshares a user namespace, so that
// uid, not root, owns the namespace, and waits to be killed. The child runs
// async-signal-safe libc calls only (it is a fork of a multi-threaded Go
// process) and never returns into Go; it reports on syncfd: one zero byte
// once the namespace exists, or the errno of the step that failed.
static int sandboxd_userns_owner(unsigned int uid, unsigned int gid, int syncfd, int closefd) {
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	close(closefd);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	unsigned char e = 0;
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0 ||
	    unshare(CLONE_NEWUSER) < 0)
		e = errno ? errno : 255;
	if (write(syncfd, &e, 1) != 1 || e != 0)
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
	pid, errno := C.sandboxd_userns_owner(C.uint(m.HostID), C.uint(m.HostID), C.int(p[1]), C.int(p[0]))
	w.Close()
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
