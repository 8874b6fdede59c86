//go:build cgo && seccomp

package seccomp

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/fdwatch"
)

// MonitorSupported reports whether this build can receive notifications.
const MonitorSupported = true

// Monitor receives one sandbox's seccomp notifications (see WithNotify),
// counts each refused syscall against the key attribute returns for the
// calling pid (the job) and answers EPERM.
type Monitor struct {
	ln        *net.UnixListener
	attribute func(pid int) string
	log       *slog.Logger

	mu     sync.Mutex
	counts map[string]map[string]uint64 // key → syscall → count
	done   chan struct{}
}

// Listen starts a Monitor on a unix socket at path, for libcontainer to
// send the notification descriptor to once the sandbox's filter is loaded.
func Listen(path string, attribute func(pid int) string, log *slog.Logger) (*Monitor, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("seccomp listener: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("seccomp listener: %w", err)
	}
	m := &Monitor{ln: ln, attribute: attribute, log: log, counts: map[string]map[string]uint64{}, done: make(chan struct{})}
	go m.serve()
	return m, nil
}

// Close stops accepting; a descriptor already received is served until the
// sandbox is gone.
func (m *Monitor) Close() { m.ln.Close() }

// Done is closed when the monitor has stopped serving.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Take returns and forgets the counts of key.
func (m *Monitor) Take(key string) map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.counts[key]
	delete(m.counts, key)
	return c
}

func (m *Monitor) serve() {
	c, err := m.ln.AcceptUnix()
	m.ln.Close() // libcontainer connects once
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			m.log.Warn("seccomp listener", "err", err)
		}
		close(m.done)
		return
	}
	fd, err := receiveFD(c)
	c.Close()
	if err != nil {
		m.log.Warn("seccomp listener: no notification descriptor", "err", err)
		close(m.done)
		return
	}
	// From here on the descriptor is served by the process's one watcher
	// of descriptors (pkg/fdwatch), and this goroutine, which lived only
	// through the sandbox's start, ends: a goroutine per live sandbox
	// parked on the descriptor cost its stack and its g in the daemon. A
	// goroutine blocked in poll(2) would even hold an OS thread.
	if w := fdwatch.Shared(); w != nil {
		if err := w.Add(fd, m.ready); err == nil {
			return
		}
	}
	m.serveAlone(fd)
}

// ready answers the pending notifications of fd, at most readyBatch of
// them; it reports true (fd is done with) once every process of the
// sandbox is gone. It never blocks: NOTIF_RECV blocks whatever the
// descriptor's flags, so it is called only when poll(2) says a
// notification is pending (the kernel's count of them then lets it
// return at once, ENOENT if the caller died meanwhile).
func (m *Monitor) ready(fd int) (done bool) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for range readyBatch {
		fds[0].Revents = 0
		if _, err := unix.Poll(fds, 0); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			close(m.done)
			return true
		}
		switch {
		case fds[0].Revents&unix.POLLIN != 0:
			m.answer(fd)
		case fds[0].Revents != 0:
			close(m.done) // POLLHUP: every process of the sandbox is gone
			return true
		default:
			return false
		}
	}
	// More are pending: a sandbox whose processes refuse syscalls as fast
	// as they are answered must not keep the shared watcher from the
	// other sandboxes' descriptors. The descriptor stays ready and is
	// served again in the watcher's next round.
	return false
}

// readyBatch bounds the notifications one ready call answers.
const readyBatch = 32

// serveAlone serves fd from this goroutine, in Go's poller, where the
// shared watcher cannot take it.
func (m *Monitor) serveAlone(fd int) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		close(m.done)
		m.log.Warn("seccomp listener", "err", err)
		return
	}
	f := os.NewFile(uintptr(fd), "seccomp-notify")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		close(m.done)
		m.log.Warn("seccomp listener", "err", err)
		return
	}
	// The poller is edge-triggered: ready answers every pending
	// notification before the goroutine waits again.
	finished := false
	_ = rc.Read(func(fd uintptr) bool {
		// Edge-triggered: answer until none is pending, batch after batch.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for !finished {
			if finished = m.ready(int(fd)); finished {
				break
			}
			fds[0].Revents = 0
			if n, err := unix.Poll(fds, 0); err == nil && n == 0 {
				return false
			}
		}
		return true
	})
	if !finished {
		close(m.done)
	}
}

// answer receives one notification, counts it and refuses the syscall.
func (m *Monitor) answer(fd int) {
	req, err := libseccomp.NotifReceive(libseccomp.ScmpFd(fd))
	if err != nil {
		return // the caller died (ENOENT) or was interrupted
	}
	name, err := libseccomp.ScmpSyscall(req.Data.Syscall).GetNameByArch(req.Data.Arch)
	if err != nil {
		name = fmt.Sprintf("syscall_%d", req.Data.Syscall)
	}
	// The caller is parked in the syscall, so its /proc entry is there.
	key := m.attribute(int(req.Pid))
	// Counted before the answer: once answered, the caller may exit and
	// its result be collected (Take) before this goroutine runs again.
	m.mu.Lock()
	if m.counts[key] == nil {
		m.counts[key] = map[string]uint64{}
	}
	m.counts[key][name]++
	m.mu.Unlock()
	_ = libseccomp.NotifRespond(libseccomp.ScmpFd(fd), &libseccomp.ScmpNotifResp{ID: req.ID, Error: int32(unix.EPERM)})
}

// receiveFD reads libcontainer's message: the container's state as JSON
// with the notification descriptor attached.
func receiveFD(c *net.UnixConn) (int, error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return -1, err
	}
	var fds []int
	for _, msg := range msgs {
		if r, err := unix.ParseUnixRights(&msg); err == nil {
			fds = append(fds, r...)
		}
	}
	var st specs.ContainerProcessState
	if err := json.Unmarshal(buf[:n], &st); err != nil || len(fds) == 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("unexpected message (%d descriptors): %v", len(fds), err)
	}
	for _, fd := range fds[1:] {
		unix.Close(fd)
	}
	return fds[0], nil
}
