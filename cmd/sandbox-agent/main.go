// Command sandbox-agent runs as PID 1 inside every sandbox: it serves the
// protocol of package agent (pkg/agent/server) on a unix socket bind-mounted
// from the host. In a Linux test guest of the VM backend it serves the same
// protocol over a virtio-serial port instead (--virtio-port; see
// pkg/vm/vport), started by the guest's init.
//
// Security boundary: the socket's directory is root-only, so only the host
// daemon talks to the agent; sandboxed code (uid 1000) cannot. The rest of
// the boundary — commands in their own session without capabilities, file
// paths resolved with openat2(RESOLVE_IN_ROOT) — is enforced in
// pkg/agent/server; with --landlock the agent first confines itself and
// every process it will start to the paths the daemon declared
// (pkg/landlock).
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent/server"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm/vport"
)

func main() {
	if filepath.Base(os.Args[0]) == "sudo" {
		os.Exit(sudoMain(os.Args[1:])) // the sudo channel's client (sudo.go)
	}
	server.MaybeJobExec(os.Args) // a job's start (pkg/agent/server/jobexec.go); returns otherwise
	trimRuntime()
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println("sandbox-agent", version.Version)
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // usage was printed
		}
		log.Error("sandbox-agent failed", "err", err)
		os.Exit(1)
	}
}

// maxProcs caps the agent's Ps. Each P brings OS threads (their kernel and
// signal stacks) and caches that stay for good in every sandbox's memory,
// so a large host's CPU count is not the agent's to use; but one P is not
// enough: a P held through a spare's vfork or a blocking file system call
// stalls the requests waiting behind it (measured on a 2-CPU host: one P
// saved 0.2 MiB per idle sandbox and made create and exec about 15%
// slower, docs/ARCHITECTURE.md).
const maxProcs = 2

// trimRuntime sizes the Go runtime for an agent, which sits idle in every
// sandbox and whose memory each sandbox is charged (docs/ARCHITECTURE.md,
// "Where an idle sandbox's memory goes").
func trimRuntime() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > maxProcs {
		runtime.GOMAXPROCS(maxProcs)
	}
	// Nothing reads the agent's heap profile; sampling would fill the
	// profiler's 1.4 MiB bucket table a page at a time.
	runtime.MemProfileRate = 0
}

type options struct {
	socket     string
	listenFD   int
	virtioPort string
	nofile     uint64
	// landlock confines the agent and its commands to landlockPaths
	// before anything is served (pkg/landlock); failing that, the agent
	// exits and the sandbox does not start.
	landlock      bool
	landlockPaths []landlock.Path
	server.Options
}

func parseFlags(args []string) (*options, error) {
	var o options
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	fs.StringVar(&o.socket, "socket", "/.sandboxd/run/agent.sock", "unix socket to listen on (its directory is the agent's private dir)")
	fs.IntVar(&o.listenFD, "listen-fd", 0, "serve on this inherited listening unix socket (bound by the daemon at --socket before the start) instead of binding --socket")
	fs.StringVar(&o.virtioPort, "virtio-port", "", "serve on this virtio-serial port (a VM guest) instead of the socket")
	fs.StringVar(&o.Root, "root", "/", "directory that file operations are confined to")
	fs.IntVar(&o.UID, "uid", 1000, "default uid of commands and owner of written files")
	fs.IntVar(&o.GID, "gid", 1000, "default gid of commands and group of written files")
	fs.IntVar(&o.RetainBytes, "retain-bytes", 1<<20, "output retained per stream of each job")
	fs.IntVar(&o.MaxFinished, "max-finished", 256, "finished jobs kept before the oldest are dropped")
	fs.Uint64Var(&o.nofile, "nofile", 0, "lower RLIMIT_NOFILE to this (0: keep) and RLIMIT_CORE to 0 at start, for runtimes that cannot set them (a user namespace owned by another uid)")
	fs.BoolVar(&o.RootMode, "root-mode", false, "a root-mode sandbox (its own user namespace): commands asked to run as uid 0 keep root's capabilities even when --uid is not 0")
	fs.StringVar(&o.Cgroups, "cgroups", "", "where the sandbox's delegated cgroups are mounted; every job then gets its own cgroup")
	fs.Int64Var(&o.JobsPids, "jobs-pids", 0, "with --cgroups: the most tasks the jobs may have together, below the sandbox's pids limit by the agent's reserve (0: no limit of their own)")
	fs.BoolVar(&o.landlock, "landlock", false, "confine the agent and every command with Landlock to the --landlock-path paths before serving; exit if the kernel cannot")
	fs.Func("landlock-path", "with --landlock: a path the sandbox is meant to reach, as <ro|rw>[,exec][,dev]:<path> (repeated; the root and each declared mount point)", func(s string) error {
		p, err := landlock.ParsePath(s)
		o.landlockPaths = append(o.landlockPaths, p)
		return err
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() != 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case !filepath.IsAbs(o.socket):
		return nil, fmt.Errorf("--socket %q is not absolute", o.socket)
	case o.JobsPids < 0:
		return nil, fmt.Errorf("--jobs-pids %d: want 0 or more", o.JobsPids)
	case o.landlock && len(o.landlockPaths) == 0:
		return nil, errors.New("--landlock without a --landlock-path would refuse every file")
	case !o.landlock && len(o.landlockPaths) > 0:
		return nil, errors.New("--landlock-path without --landlock")
	case o.listenFD != 0 && o.listenFD < 3:
		return nil, fmt.Errorf("--listen-fd %d: want an inherited descriptor, 3 or above", o.listenFD)
	}
	o.PrivateDir = filepath.Dir(o.socket)
	return &o, nil
}

func run(log *slog.Logger, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	if o.nofile > 0 {
		if err := lowerRlimits(o.nofile); err != nil {
			return err
		}
	}
	if o.landlock {
		// Before the server starts its first child (a spare): every
		// process of the sandbox is in the domain from the start.
		rep, err := landlock.Enforce(o.landlockPaths)
		if err != nil {
			return err
		}
		if len(rep.Undeclared) > 0 {
			log.Warn("undeclared mounts in the sandbox: refused by Landlock", "mounts", rep.Undeclared)
		}
		log.Info("landlock enforced", "abi", rep.ABI, "rules", rep.Rules)
	}
	if os.Getpid() != 1 {
		// Orphans of our commands are then reparented to us, so the reaper
		// sees them and timeouts can sweep them, as when we are PID 1.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("cannot become child subreaper", "err", err)
		}
	}
	// The server registers for SIGCHLD before any child exists.
	srv, err := server.New(log, o.Options)
	if err != nil {
		return err
	}
	defer srv.Close()

	// The handler stays installed until the process exits: a second
	// SIGTERM during shutdown must not kill the agent with status 143.
	// Not os/signal's: it holds two threads in every sandbox for good
	// (pkg/agent/server/signals.go).
	term := make(chan os.Signal, 1)
	if err := server.NotifyTermination(term); err != nil {
		return err
	}

	ln, err := listen(o)
	if err != nil {
		return err
	}
	log.Info("sandbox-agent listening", "socket", o.socket, "virtio_port", o.virtioPort, "root", o.Root, "pid", os.Getpid(), "version", version.Version)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if o.RootMode {
		// Root on request for a non-root default user: sudo asks here
		// (pkg/agent/sudo.go).
		sl, err := server.ListenSudo()
		if err != nil {
			return fmt.Errorf("sudo channel: %w", err)
		}
		defer sl.Close()
		go func() { _ = srv.ServeSudo(sl) }()
	}
	select {
	case sig := <-term:
		log.Info("terminating: killing all jobs", "signal", sig)
		ln.Close()
		srv.KillAll()
		return nil
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
}

// listen returns the listener of the agent's connections.
func listen(o *options) (net.Listener, error) {
	if o.virtioPort != "" {
		// Only the host (QEMU's chardev, the daemon) is at the other end of
		// the port; guest processes cannot open it unless root.
		return vport.Listen(o.virtioPort, slog.Default())
	}
	if o.listenFD > 0 {
		// The daemon bound the socket (root's on the host, 0600) before
		// our start and connects as soon as it started us. The listener
		// gets a close-on-exec duplicate: no command inherits it.
		f := os.NewFile(uintptr(o.listenFD), "agent-listener")
		defer f.Close()
		ln, err := net.FileListener(f)
		if err != nil {
			return nil, fmt.Errorf("--listen-fd %d: %w", o.listenFD, err)
		}
		if _, ok := ln.(*net.UnixListener); !ok {
			ln.Close()
			return nil, fmt.Errorf("--listen-fd %d: not a unix socket", o.listenFD)
		}
		return ln, nil
	}
	if err := os.Remove(o.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", o.socket)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// The directory is already root-only; the mode is a second fence.
	if err := os.Chmod(o.socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return ln, nil
}

// lowerRlimits sets RLIMIT_NOFILE to n (at most the current hard limit:
// lowering needs no privilege, raising needs CAP_SYS_RESOURCE on the host)
// and forbids core dumps; every command inherits both.
func lowerRlimits(n uint64) error {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	n = min(n, cur.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fmt.Errorf("lower RLIMIT_NOFILE: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("lower RLIMIT_CORE: %w", err)
	}
	return nil
}
