package fdwatch

import (
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitLen waits (bounded) until w watches n descriptors.
func waitLen(t *testing.T, w *Watcher, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); w.Len() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("watcher holds %d descriptors, want %d", w.Len(), n)
		}
		time.Sleep(time.Millisecond) // a sampling interval, not synchronisation
	}
}

// A process's exit is reported through its pidfd, which is then closed.
func TestPidfdExit(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan int, 1)
	if err := w.Add(pidfd, func(fd int) bool { exited <- fd; return true }); err != nil {
		t.Fatal(err)
	}
	if w.Len() != 1 {
		t.Fatalf("Len = %d after one Add", w.Len())
	}
	select {
	case <-exited:
		t.Fatal("reported before the process exited")
	case <-time.After(50 * time.Millisecond): // it must not be reported: nothing to wait for
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case fd := <-exited:
		if fd != pidfd {
			t.Errorf("ready called with descriptor %d, want %d", fd, pidfd)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the exit was not reported within 5 s")
	}
	waitLen(t, w, 0)
}

// ready is called each time the descriptor is readable, until it says done.
func TestReadyUntilDone(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	wr := os.NewFile(uintptr(p[1]), "pipe-w")
	defer wr.Close()
	got := make(chan string, 10)
	ready := func(fd int) bool {
		buf := make([]byte, 64)
		n, err := unix.Read(fd, buf)
		if n == 0 && err == nil {
			got <- "EOF"
			return true
		}
		if n > 0 {
			got <- string(buf[:n])
		}
		return false
	}
	if err := w.Add(p[0], ready); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"a", "bc"} {
		if _, err := wr.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		select {
		case s := <-got:
			if s != msg {
				t.Errorf("ready read %q, want %q", s, msg)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q not reported within 5 s", msg)
		}
	}
	wr.Close()
	select {
	case s := <-got:
		if s != "EOF" {
			t.Errorf("ready read %q, want EOF", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hang-up was not reported within 5 s")
	}
	waitLen(t, w, 0)
}

// A descriptor epoll refuses stays the caller's, open; a negative one is
// refused.
func TestAddRefused(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(-1, func(int) bool { return true }); err == nil {
		t.Error("Add(-1) succeeded")
	}
	f, err := os.CreateTemp(t.TempDir(), "regular")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := w.Add(int(f.Fd()), func(int) bool { return true }); err == nil {
		t.Fatal("Add of a regular file succeeded (epoll refuses them)")
	}
	if w.Len() != 0 {
		t.Errorf("Len = %d after a refused Add", w.Len())
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("the refused descriptor was closed: %v", err)
	}
}

// Shared is one watcher for the process.
func TestShared(t *testing.T) {
	a, b := Shared(), Shared()
	if a == nil || a != b {
		t.Fatalf("Shared() = %p, %p: want one watcher", a, b)
	}
}

// A descriptor that stays readable (a ready that never consumes what it
// is given, as a sandbox refusing syscalls as fast as they are answered)
// does not keep the watcher from another descriptor.
func TestBusyDescriptorDoesNotStarveOthers(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	pipe := func() (r int, wr *os.File) {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		return p[0], os.NewFile(uintptr(p[1]), "pipe-w")
	}
	busyR, busyW := pipe()
	defer busyW.Close()
	if _, err := busyW.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var busyCalls atomic.Int64
	stop := make(chan struct{})
	if err := w.Add(busyR, func(int) bool {
		busyCalls.Add(1)
		select {
		case <-stop:
			return true
		default:
			return false // never reads: stays readable
		}
	}); err != nil {
		t.Fatal(err)
	}
	defer close(stop)
	for deadline := time.Now().Add(5 * time.Second); busyCalls.Load() < 100; {
		if time.Now().After(deadline) {
			t.Fatalf("the busy descriptor was served %d times in 5 s", busyCalls.Load())
		}
		time.Sleep(time.Millisecond) // a sampling interval, not synchronisation
	}
	otherR, otherW := pipe()
	defer otherW.Close()
	served := make(chan struct{})
	if err := w.Add(otherR, func(int) bool { close(served); return true }); err != nil {
		t.Fatal(err)
	}
	if _, err := otherW.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatalf("another descriptor was not served within 5 s while a busy one was (%d calls)", busyCalls.Load())
	}
}
