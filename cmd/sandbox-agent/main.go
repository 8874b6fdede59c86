// Command sandbox-agent runs as PID 1 inside every sandbox. It reaps
// zombies, runs commands as jobs that survive daemon restarts, streams their
// output and serves file operations confined to the sandbox root, all over
// the protocol of package agent on a unix socket bind-mounted from the host.
//
// Security boundary: the socket's directory is root-only, so only the host
// daemon talks to the agent; sandboxed code (uid 1000) cannot. Commands run
// in their own session without capabilities. File paths resolve with
// openat2(RESOLVE_IN_ROOT), so symlinks planted by sandboxed code cannot
// lead the agent outside the root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/version"
	"golang.org/x/sys/unix"
)

func main() {
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

type options struct {
	socket      string
	root        string
	uid, gid    int
	retainBytes int
	maxFinished int
}

func parseFlags(args []string) (*options, error) {
	var o options
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	fs.StringVar(&o.socket, "socket", "/.sandboxd/run/agent.sock", "unix socket to listen on")
	fs.StringVar(&o.root, "root", "/", "directory that file operations are confined to")
	fs.IntVar(&o.uid, "uid", 1000, "default uid of commands and owner of written files")
	fs.IntVar(&o.gid, "gid", 1000, "default gid of commands and group of written files")
	fs.IntVar(&o.retainBytes, "retain-bytes", 1<<20, "output retained per stream of each job")
	fs.IntVar(&o.maxFinished, "max-finished", 256, "finished jobs kept before the oldest are dropped")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() != 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case !filepath.IsAbs(o.socket):
		return nil, fmt.Errorf("--socket %q is not absolute", o.socket)
	case o.uid < 0 || o.gid < 0:
		return nil, errors.New("--uid and --gid must not be negative")
	case o.retainBytes < 4096:
		return nil, errors.New("--retain-bytes must be at least 4096")
	case o.maxFinished < 1:
		return nil, errors.New("--max-finished must be at least 1")
	}
	return &o, nil
}

func run(log *slog.Logger, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	if os.Getpid() != 1 {
		// Orphans of our commands are then reparented to us, so the reaper
		// sees them and timeouts can sweep them, as when we are PID 1.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("cannot become child subreaper", "err", err)
		}
	}
	// Register for SIGCHLD before any child exists so no exit is missed.
	reaper := newReaper(log)
	files, err := newFileService(o.root, filepath.Dir(o.socket), o.uid, o.gid)
	if err != nil {
		return err
	}
	defer files.close()
	jobs := newJobTable(log, reaper, o)

	// The handler stays installed until the process exits: a second
	// SIGTERM during shutdown must not kill the agent with status 143.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go reaper.run(ctx)

	if err := os.Remove(o.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: o.socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The directory is already root-only; the mode is a second fence.
	if err := os.Chmod(o.socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("chmod socket: %w", err)
	}
	log.Info("sandbox-agent listening", "socket", o.socket, "root", o.root, "pid", os.Getpid(), "version", version.Version)

	srv := &server{log: log, jobs: jobs, files: files, started: time.Now()}
	errc := make(chan error, 1)
	go func() { errc <- srv.serve(ln) }()
	select {
	case sig := <-term:
		log.Info("terminating: killing all jobs", "signal", sig)
		ln.Close()
		jobs.killAll()
		return nil
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
}
