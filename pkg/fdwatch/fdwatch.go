// Package fdwatch waits for many file descriptors from one goroutine: the
// descriptors are in an epoll set of their own, and that set's descriptor
// waits in Go's poller (an epoll descriptor is readable while any
// descriptor in its set is ready).
//
// The daemon watches two descriptors for every live sandbox for as long
// as it lives: its init's pidfd (readable once init has exited) and,
// with seccomp diagnostics, the filter's notification descriptor. A
// goroutine parked on each cost its stack, its g and its os.File in the
// daemon per sandbox (docs/ARCHITECTURE.md, "Where an idle sandbox's
// memory goes"); here they cost a map entry. Readiness is seen as soon as
// the kernel reports it: an init's death is noticed as fast as before.
package fdwatch

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Ready is called in the watcher's goroutine each time fd is readable. It
// must not block: every other descriptor waits behind it (hand longer
// work to a goroutine of its own). It returns true when fd is done with:
// the watcher then removes it from the set and closes it. A descriptor
// is watched level-triggered, so Ready must consume what made it readable
// or return true, or it is called again at once.
type Ready func(fd int) (done bool)

// Watcher is one epoll set and the goroutine that serves it.
type Watcher struct {
	epfd int

	mu    sync.Mutex
	ready map[int32]Ready // by descriptor
}

var (
	sharedOnce sync.Once
	shared     *Watcher // nil when the poller takes no epoll descriptor here
)

// Shared returns the process's watcher, started on first use (package
// initialisation does no work: CONTRIBUTING.md), or nil when it cannot
// run here; callers then wait in a goroutine of their own.
func Shared() *Watcher {
	sharedOnce.Do(func() {
		if w, err := New(); err == nil {
			shared = w
		}
	})
	return shared
}

// New starts a watcher. It lives as long as the process: nothing stops it.
func New() (*Watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fdwatch: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("fdwatch: %w", err)
	}
	f := os.NewFile(uintptr(epfd), "fdwatch")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fdwatch: %w", err)
	}
	w := &Watcher{epfd: epfd, ready: map[int32]Ready{}}
	go func() {
		// Go's poller is edge-triggered: every ready descriptor is served
		// before the callback returns false and the goroutine parks again.
		err := rc.Read(func(uintptr) bool {
			w.drain()
			return false
		})
		// Only a closed descriptor ends Read, and nothing closes f (it is
		// reachable from this goroutine, so no finalizer closes it either).
		panic(fmt.Sprintf("fdwatch: watcher stopped: %v", err))
	}()
	return w, nil
}

// Add watches fd, which the watcher takes over: it calls ready whenever
// fd is readable (or hung up) until ready returns true, then closes fd.
// On error fd is neither watched nor closed: it is still the caller's.
func (w *Watcher) Add(fd int, ready Ready) error {
	if fd < 0 {
		return fmt.Errorf("fdwatch: invalid descriptor %d", fd)
	}
	// The descriptor is the key: its number stays taken until drain has
	// removed it from the map and the set and closed it.
	w.mu.Lock()
	w.ready[int32(fd)] = ready
	w.mu.Unlock()
	// Level-triggered inside the set: a descriptor ready before it was
	// added is reported at once.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		w.mu.Lock()
		delete(w.ready, int32(fd))
		w.mu.Unlock()
		return fmt.Errorf("fdwatch: add descriptor %d: %w", fd, err)
	}
	return nil
}

// Len is the number of descriptors watched.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready)
}

// drain serves every ready descriptor until none is.
func (w *Watcher) drain() {
	var evs [64]unix.EpollEvent
	for {
		n, err := unix.EpollWait(w.epfd, evs[:], 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		for _, ev := range evs[:n] {
			w.mu.Lock()
			ready := w.ready[ev.Fd]
			w.mu.Unlock()
			if ready == nil {
				// Not ours (cannot happen: Add maps a descriptor before
				// adding it): out of the set, and left open.
				_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
				continue
			}
			if ready(int(ev.Fd)) {
				w.mu.Lock()
				delete(w.ready, ev.Fd)
				w.mu.Unlock()
				_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
				unix.Close(int(ev.Fd))
			}
		}
	}
}
