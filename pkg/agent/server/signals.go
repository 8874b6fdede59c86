package server

// Signals reach the agent without os/signal. os/signal costs every sandbox
// two OS threads for good — the receiver of its queue sleeps in the kernel
// holding a thread, and the runtime keeps another locked to a goroutine
// that tracks the signal mask — ~80 KiB each of the sandbox's memory
// (BenchmarkIdleMemory, 50 fresh sandboxes: threads 7.5 → 6.1, 1.81 →
// 1.69 MiB; docs/ARCHITECTURE.md). Here a C handler writes the signal's
// number to a pipe whose read end waits in Go's poller, which holds no
// thread. A signalfd cannot do it: the runtime unblocks SIGCHLD, SIGTERM
// and SIGINT on every thread it starts.
//
// The handler replaces the runtime's for the signals given, for the rest
// of the process (the runtime installs its own only at start and through
// os/signal, which the agent does not use for them). It is async-signal-
// safe (one write(2), errno kept) and runs on the signal stack the runtime
// gives every thread (SA_ONSTACK). The pipe is non-blocking: when it is
// full, wake-ups are already pending and the signal coalesces, as pending
// signals do.

/*
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

// The pipe's write end plus one, per signal (0: none).
static volatile int sandboxd_sigpipe[65];

static void sandboxd_sighandler(int sig) {
	int saved = errno;
	if (sig > 0 && sig < 65 && sandboxd_sigpipe[sig] > 0) {
		unsigned char b = (unsigned char)sig;
		ssize_t n = write(sandboxd_sigpipe[sig] - 1, &b, 1);
		(void)n;
	}
	errno = saved;
}

static int sandboxd_sigcatch(int sig, int fd) {
	struct sigaction sa;
	if (sig <= 0 || sig >= 65) {
		errno = EINVAL;
		return -1;
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = sandboxd_sighandler;
	sa.sa_flags = SA_ONSTACK | SA_RESTART;
	sigfillset(&sa.sa_mask);
	sandboxd_sigpipe[sig] = fd + 1;
	return sigaction(sig, &sa, NULL);
}
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// sigHub fans the signals read from the handler's pipe out to the channels
// registered for them, as os/signal does: a send never blocks, so a slow
// receiver sees one signal for several (a buffered channel of one is
// enough for a wake-up).
var sigHub struct {
	once sync.Once
	err  error
	w    int // the pipe's write end, for the handler
	mu   sync.Mutex
	subs map[chan<- os.Signal][]syscall.Signal
}

// notifySignals relays sigs to c, like signal.Notify, from the first call
// on for the rest of the process.
func notifySignals(c chan<- os.Signal, sigs ...syscall.Signal) error {
	sigHub.once.Do(startSigHub)
	if sigHub.err != nil {
		return sigHub.err
	}
	sigHub.mu.Lock()
	defer sigHub.mu.Unlock()
	sigHub.subs[c] = append(sigHub.subs[c], sigs...)
	for _, s := range sigs {
		if rc, err := C.sandboxd_sigcatch(C.int(s), C.int(sigHub.w)); rc != 0 {
			return fmt.Errorf("catch %v: %w", s, err)
		}
	}
	return nil
}

// stopSignals ends the relaying to c (the handler stays: signals then reach
// nobody, as the runtime's own handler would ignore them).
func stopSignals(c chan<- os.Signal) {
	sigHub.mu.Lock()
	delete(sigHub.subs, c)
	sigHub.mu.Unlock()
}

func startSigHub() {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		sigHub.err = fmt.Errorf("signal pipe: %w", err)
		return
	}
	sigHub.w = p[1]
	sigHub.subs = map[chan<- os.Signal][]syscall.Signal{}
	// Non-blocking, so reads wait in the poller, not on a thread.
	r := os.NewFile(uintptr(p[0]), "signals")
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := r.Read(buf)
			if err != nil {
				return // the process is ending
			}
			sigHub.mu.Lock()
			for _, b := range buf[:n] {
				sig := syscall.Signal(b)
				for c, sigs := range sigHub.subs {
					for _, s := range sigs {
						if s == sig {
							select {
							case c <- sig:
							default:
							}
						}
					}
				}
			}
			sigHub.mu.Unlock()
		}
	}()
}

// NotifyTermination relays SIGTERM and SIGINT to c without os/signal (see
// above), for the agent's main.
func NotifyTermination(c chan<- os.Signal) error {
	return notifySignals(c, syscall.SIGTERM, syscall.SIGINT)
}
