// Package hostclaim makes the host-wide names a daemon uses its own for as
// long as it lives: its run directory, its cgroup parent, its bridge and
// address range. A second daemon on the same host whose configuration
// names one of them is refused at start with an InUseError naming the
// holder (its pid and state directory) and the setting to change, before
// it touches anything of the first one's (its gc and reconcile would
// otherwise take the first daemon's sandboxes for leftovers of its own).
//
// A claim dies with its holder however it dies, kill -9 included, so a
// daemon restarted after a crash finds its names free at once:
//
//   - a path (a directory, a cgroup) is claimed by an flock on it, which
//     the kernel drops with the last descriptor;
//   - a network name is claimed by binding an abstract unix socket, which
//     lives in the network namespace of the thread that bound it, as the
//     bridges and nftables tables it stands for do: daemons in different
//     network namespaces may use the same bridge name, as tests do.
//
// Claims say who holds a name now; the marks on the objects themselves
// (pkg/network) say whose they are after their daemon died, when their
// sandboxes still run.
package hostclaim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// InUseError is a name another live process holds.
type InUseError struct {
	Setting string // the configuration key that names it, e.g. network.bridge
	Value   string // its value
	// PID is the holder's, 0 if it could not be found; StateDir its
	// daemon's state directory, "" if it carries no daemon marker.
	PID      int
	StateDir string
}

func (e *InUseError) Error() string {
	owner := "another process"
	switch {
	case e.PID > 0 && e.StateDir != "":
		owner = fmt.Sprintf("another mcp-sandboxd (pid %d, state dir %s)", e.PID, e.StateDir)
	case e.PID > 0:
		owner = fmt.Sprintf("another process (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s: %s is in use by %s; give this daemon its own %s", e.Setting, e.Value, owner, e.Setting)
}

// MarkPrefix starts every owner mark: the alias of a daemon's links, the
// comment of its nftables table's owner set.
const MarkPrefix = "mcp-sandboxd owner="

// Mark is the owner mark of the daemon whose state lives in stateDir.
// Marks outlive the daemon, as its sandboxes do.
func Mark(stateDir string) string { return MarkPrefix + stateDir }

// MarkedError is an object on the host that the configuration names but
// whose mark says is another daemon's: one not running (no claim stopped
// this one) whose sandboxes may still run and use it.
type MarkedError struct {
	Setting string // the configuration key that names it
	Object  string // e.g. "bridge sbx0"
	Mark    string // the mark it carries
}

func (e *MarkedError) Error() string {
	owner := strings.TrimPrefix(e.Mark, MarkPrefix)
	return fmt.Sprintf("%s: %s belongs to the mcp-sandboxd of state dir %s, whose sandboxes may still use it; give this daemon its own %s (or start that daemon and remove its sandboxes)",
		e.Setting, e.Object, owner, e.Setting)
}

// inUse says who holds a name. It is a start-up error, never a client's:
// the configuration must change (or the other daemon stop) before this
// daemon can start.
func inUse(setting, value string, pid int) error {
	e := &InUseError{Setting: setting, Value: value, PID: pid}
	if pid > 0 {
		e.StateDir = lifetime.StateDirOf(pid)
	}
	return e
}

// Claim is one name held; Release gives it up.
type Claim struct {
	release func() error
}

// Release gives the name up. Idempotent.
func (c *Claim) Release() error {
	if c == nil || c.release == nil {
		return nil
	}
	r := c.release
	c.release = nil
	return r()
}

// Path claims the file or directory at path (it must exist), which
// setting names. The descriptor is close-on-exec: no process the daemon
// starts keeps the claim after the daemon is gone.
func Path(path, setting string) (*Claim, error) {
	f, err := os.Open(path) // O_CLOEXEC; a directory opens read-only too
	if err != nil {
		return nil, fmt.Errorf("%s: claim %s: %w", setting, path, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		pid := 0
		if holders := lifetime.LockHolders(f); len(holders) > 0 {
			pid = holders[0]
		}
		f.Close()
		return nil, inUse(setting, path, pid)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: claim %s: %w", setting, path, err)
	}
	return &Claim{release: f.Close}, nil
}

// abstractPrefix starts every abstract socket name of a claim.
const abstractPrefix = "mcp-sandboxd/"

// Name claims name (e.g. "bridge/sbx0") in the network namespace of the
// calling thread, for the value of setting. The socket answers every
// connection by closing it: a second claimant learns the holder's pid
// from the connection's peer credentials.
func Name(name, setting, value string) (*Claim, error) {
	addr := "@" + abstractPrefix + name
	if len(addr) > 107 {
		return nil, errdefs.Invalidf("%s: %q is too long", setting, value)
	}
	// Twice at most: a holder that died between our bind and our connect
	// left the name free.
	for range 2 {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		if err == nil {
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			return &Claim{release: l.Close}, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("%s: claim %s: %w", setting, value, err)
		}
		pid, err := peerPID(addr)
		if errors.Is(err, unix.ECONNREFUSED) {
			continue
		}
		return nil, inUse(setting, value, pid)
	}
	return nil, inUse(setting, value, 0)
}

// peerPID connects to the abstract socket addr and returns the pid of
// the process that listens on it.
func peerPID(addr string) (int, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}
