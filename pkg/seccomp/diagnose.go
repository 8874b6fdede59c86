package seccomp

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Blocked-syscall diagnostics. A command that is refused a syscall should
// learn which one, and how often: "Operation not permitted" from unshare is
// a mystery, "blocked syscall unshare ×1" is not.
//
// WithNotify turns the refusal of every syscall in Diagnosed that the
// profile does not allow into SCMP_ACT_NOTIFY. The kernel then parks the
// calling thread and hands the request to the daemon's Monitor (through
// libcontainer's listenerPath), which counts it against the calling job
// and answers EPERM — the profile's own answer. Allowed syscalls never
// reach the daemon, so they cost nothing; a refused one costs a round
// trip to the daemon (figures in docs/security.md §2). The kernel
// audit log (SCMP_ACT_LOG / SECCOMP_FILTER_FLAG_LOG) was the alternative:
// it is global, printk-rate-limited (lossy under a flood, which sandboxed
// code controls) and pollutes the host's log, and a process often exits
// before its record can be attributed to a job by its pid.
//
// If the daemon is gone (restarted) the kernel answers ENOSYS instead of
// EPERM: still refused, no longer counted.

// Diagnosed are the syscalls whose refusal is reported: the ones a program
// reaches for when it tries to leave its sandbox, plus the strict profile's.
var Diagnosed = []string{
	"unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
	"move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	"keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev",
	"open_by_handle_at", "name_to_handle_at", "reboot", "swapon", "swapoff", "acct", "syslog",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "quotactl",
	"lookup_dcookie", "vhangup", "kcmp", "pidfd_getfd", "process_madvise", "fanotify_init",
	"nfsservctl", "create_module", "get_kernel_syms", "query_module", "uselib", "ustat", "sysfs",
	"_sysctl", "vm86", "vm86old",
}

// WithNotify returns a copy of p in which the refusal of each Diagnosed
// syscall goes through the notification listener at listenerPath. Syscalls
// the profile allows, even conditionally, are left alone; a plain EPERM
// rule becomes a notify rule; an absent one (refused by the default
// action) gets one. Nothing changes unless the default action is EPERM.
func WithNotify(p *specs.LinuxSeccomp, listenerPath string) *specs.LinuxSeccomp {
	if p == nil || p.DefaultAction != specs.ActErrno || (p.DefaultErrnoRet != nil && *p.DefaultErrnoRet != 1) {
		return p
	}
	out := *p
	out.Syscalls = nil
	named := map[string]bool{}
	allowed := map[string]bool{}
	for _, sc := range p.Syscalls {
		for _, n := range sc.Names {
			named[n] = true
			if sc.Action != specs.ActErrno || len(sc.Args) > 0 || (sc.ErrnoRet != nil && *sc.ErrnoRet != 1) {
				allowed[n] = true
			}
		}
	}
	var notify []string
	for _, n := range Diagnosed {
		if !allowed[n] {
			notify = append(notify, n)
		}
	}
	for _, sc := range p.Syscalls {
		if sc.Action == specs.ActErrno && len(sc.Args) == 0 && (sc.ErrnoRet == nil || *sc.ErrnoRet == 1) {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return slices.Contains(notify, n) })
			if len(sc.Names) == 0 {
				continue
			}
		}
		out.Syscalls = append(out.Syscalls, sc)
	}
	if len(notify) > 0 {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: notify, Action: specs.ActNotify})
		out.ListenerPath = listenerPath
	}
	return &out
}
