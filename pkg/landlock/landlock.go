// Package landlock is the sandboxes' Landlock layer (the kernel's
// unprivileged, path-based access control): the daemon detects the kernel's
// Landlock ABI and lists the paths a sandbox is meant to reach (Path, from
// the OCI spec it builds: pkg/runtime), and the agent, PID 1 of the
// sandbox, confines itself and every command it will start to them
// (Enforce) before it serves.
//
// Security boundary. Landlock sits behind the sandbox's namespaces,
// seccomp, capabilities and user namespace; it adds what they cannot say:
//
//   - A mount the daemon did not declare (a bind it did not intend, a
//     mount propagated in from the host) is refused to everything in the
//     sandbox, the agent's file operations included, even when mount
//     namespaces, permissions and the user namespace would let it be read.
//     The agent compares its mount table with the declared paths at start;
//     an undeclared mount point gets no rule, and its ancestors' rules are
//     split so that none covers it (see rules).
//   - A read-only rootfs or mount is read-only to Landlock too: a mount
//     flag lost by mistake (a remount, a runtime change) leaves the files
//     unwritable. noexec mounts lose the execute right the same way, and
//     only /dev grants ioctl on device files.
//   - A confined process cannot mount, unmount or pivot_root, and cannot
//     ptrace a process outside its domain.
//
// What it does not do. Landlock rules are fixed when the ruleset is made,
// from the agent's own view after pivot_root: everything is beneath the
// sandbox's root by construction, so "the root" is not the boundary; the
// declared mount list is. A mistaken mount placed over a declared path, or
// a host path reachable beneath a declared mount's own source, looks
// declared and is allowed. Metadata calls (stat, chmod, chown, xattrs,
// utimes) are not Landlock rights. Network: Landlock's TCP rules (ABI 4)
// match ports only, never addresses, for bind and connect; a sandbox's
// network policy is by address (nftables in its own namespace) and its
// programs bind any port (Jupyter kernels' random loopback ports, servers
// the ports feature publishes) and connect to any port egress allows. No
// port set could be narrower than that without breaking allowed
// networking, so the network is left to the namespace and nftables
// layers, and Landlock's network rights are not handled.
package landlock

import (
	"fmt"
	"path"
	"strings"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// Mode is the sandbox.landlock setting.
type Mode string

// Modes.
const (
	// ModeAuto confines sandboxes where the kernel has Landlock (ABI
	// MinABI or later) and runs them without it elsewhere, saying so in
	// /readyz.
	ModeAuto Mode = "auto"
	// ModeRequire refuses to start the daemon without Landlock.
	ModeRequire Mode = "require"
	// ModeOff never confines with Landlock.
	ModeOff Mode = "off"
)

// Valid reports whether m is a known mode.
func (m Mode) Valid() bool { return m == ModeAuto || m == ModeRequire || m == ModeOff }

// MinABI is the oldest Landlock ABI the sandboxes use. ABI 1 cannot grant
// the refer right: under it every rename or link across directories fails
// (mv, dpkg, pip), and go-landlock's best effort then enforces nothing.
const MinABI = 2

// ABI is the kernel's Landlock ABI version: 0 when the kernel has none
// (not built, not in the lsm= list, or seccomp refused the call).
func ABI() int {
	v, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// Support is what the daemon found of Landlock and does with it.
type Support struct {
	Mode    Mode
	ABI     int  // the kernel's ABI version, 0 without Landlock
	Enforce bool // sandboxes started from now on are confined
	// Reason says why sandboxes are not confined (empty when they are).
	Reason string
}

// Detect decides, for mode, whether sandboxes are confined on this kernel.
// It errs only when mode is ModeRequire and the kernel cannot: the daemon
// refuses to start then, naming the setting.
func Detect(mode Mode) (Support, error) {
	s := Support{Mode: mode, ABI: ABI()}
	switch {
	case mode == ModeOff:
		s.Reason = "turned off by sandbox.landlock: off"
	case s.ABI == 0:
		s.Reason = "the kernel has no Landlock (not built, or not in its lsm= list)"
	case s.ABI < MinABI:
		s.Reason = fmt.Sprintf("the kernel's Landlock ABI %d is older than %d: it cannot allow renames across directories", s.ABI, MinABI)
	default:
		s.Enforce = true
	}
	if mode == ModeRequire && !s.Enforce {
		return s, fmt.Errorf("sandbox.landlock is require, but %s; set sandbox.landlock to auto or off to run without it", s.Reason)
	}
	return s, nil
}

// Path is a path a sandbox is meant to reach, with what it may do there:
// the sandbox's root ("/") and each mount point the daemon declared.
type Path struct {
	Path     string
	Writable bool // write, create, remove, rename, truncate
	Exec     bool // execute files
	// Dev allows ioctl on device files (terminals: /dev and /dev/pts).
	Dev bool
	// Tree declares the mounts the runtime makes beneath the path too
	// (a cgroup v1 mount becomes a tmpfs and one mount per controller).
	Tree bool
}

// String is the agent's --landlock-path form: "<flags>:<path>", flags
// "rw" or "ro" followed by ",exec", ",dev" and ",tree" when set.
func (p Path) String() string {
	f := "ro"
	if p.Writable {
		f = "rw"
	}
	if p.Exec {
		f += ",exec"
	}
	if p.Dev {
		f += ",dev"
	}
	if p.Tree {
		f += ",tree"
	}
	return f + ":" + p.Path
}

// ParsePath reads a Path in String's form.
func ParsePath(s string) (Path, error) {
	flags, p, ok := strings.Cut(s, ":")
	if !ok || !path.IsAbs(p) || path.Clean(p) != p {
		return Path{}, fmt.Errorf("landlock path %q: want <ro|rw>[,exec][,dev][,tree]:<absolute clean path>", s)
	}
	out := Path{Path: p}
	for i, f := range strings.Split(flags, ",") {
		switch {
		case i == 0 && (f == "ro" || f == "rw"):
			out.Writable = f == "rw"
		case i > 0 && f == "exec":
			out.Exec = true
		case i > 0 && f == "dev":
			out.Dev = true
		case i > 0 && f == "tree":
			out.Tree = true
		default:
			return Path{}, fmt.Errorf("landlock path %q: unknown flag %q", s, f)
		}
	}
	return out, nil
}
