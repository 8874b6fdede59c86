package server

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// reaper is the only place that waits for children. As PID 1 the agent
// inherits every orphan in the sandbox, and a second waiter (os/exec's
// Wait) would steal statuses from it, so all exits are collected here with
// wait4(-1) and dispatched to the job owning the pid; the rest are
// discarded once reaped. Each exit comes with the child's resource usage
// (wait4's rusage: its own and that of the descendants it waited for,
// RUSAGE_BOTH's semantics), which is where a job's memory peak comes from
// when no memory cgroup of its own measures it.
type reaper struct {
	log   *slog.Logger
	sigc  chan os.Signal
	mu    sync.Mutex // held across fork+register and across each sweep
	owner map[int]exitFunc
}

// exitFunc receives a reaped child's wait status and resource usage.
type exitFunc func(unix.WaitStatus, *unix.Rusage)

func newReaper(log *slog.Logger) (*reaper, error) {
	r := &reaper{log: log, sigc: make(chan os.Signal, 1), owner: map[int]exitFunc{}}
	if err := notifySignals(r.sigc, syscall.SIGCHLD); err != nil {
		return nil, err
	}
	return r, nil
}

// spawn runs start, which forks a child and returns its pid, and registers
// onExit for that pid. Holding mu makes it impossible for a sweep to reap
// the child before its owner is known, however fast it exits.
func (r *reaper) spawn(start func() (int, error), onExit exitFunc) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, err
	}
	r.owner[pid] = onExit
	return pid, nil
}

// run reaps on every SIGCHLD until ctx is done. Signals coalesce, so each
// wake-up drains every exited child.
func (r *reaper) run(ctx context.Context) {
	defer stopSignals(r.sigc)
	r.sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.sigc:
			r.sweep()
		}
	}
}

func (r *reaper) sweep() {
	type exit struct {
		fn exitFunc
		ws unix.WaitStatus
		ru unix.Rusage
	}
	var exits []exit
	r.mu.Lock()
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, &ru)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil { // 0: none exited yet; ECHILD: no children
			break
		}
		if fn, ok := r.owner[pid]; ok {
			delete(r.owner, pid)
			exits = append(exits, exit{fn, ws, ru})
		}
	}
	r.mu.Unlock()
	// Dispatch outside the lock: owners may take their own locks.
	for i := range exits {
		exits[i].fn(exits[i].ws, &exits[i].ru)
	}
}

// signalGroup sends sig to the process group led by pid, but only while
// pid has not been reaped: after that the number may be reused by an
// unrelated process. It reports whether the signal was sent.
func (r *reaper) signalGroup(pid int, sig unix.Signal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.owner[pid]; !ok {
		return false
	}
	return unix.Kill(-pid, sig) == nil
}
