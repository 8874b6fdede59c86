package lifetime

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMarkerAndEnvironments(t *testing.T) {
	if got := Marker("/var/lib/x/"); got != "SANDBOXD_DAEMON=/var/lib/x" {
		t.Errorf("Marker = %q", got)
	}
	env := []string{"A=1", "SANDBOXD_DAEMON=/old", "B=2"}
	if got := Unmarked(env); !slices.Equal(got, []string{"A=1", "B=2"}) {
		t.Errorf("Unmarked = %q", got)
	}
	t.Setenv(MarkerVar, "/s")
	if got := Inherit([]string{"PATH=/bin", "SANDBOXD_DAEMON=/other"}); !slices.Equal(got, []string{"PATH=/bin", "SANDBOXD_DAEMON=/s"}) {
		t.Errorf("Inherit = %q", got)
	}
	// Already marked: nothing to do (and no exec).
	if err := EnsureMarked("/s/"); err != nil {
		t.Errorf("EnsureMarked with the marker set: %v", err)
	}
}

// TestMarkedAndLeftovers: a child with the marker of a state dir is marked
// for it (not for another), a child without is not, and a marked process
// younger than the caller is no earlier daemon's leftover; once dead it is
// not marked any more.
func TestMarkedAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	// Start times count in clock ticks (10 ms): let the children's be
	// later than this process's.
	time.Sleep(50 * time.Millisecond)
	start := func(env ...string) *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	marked := start(Marker(dir))
	plain := start()
	if !Marked(marked.Process.Pid, dir) || Marked(marked.Process.Pid, dir+"-other") {
		t.Errorf("Marked of the marked child: %v for its dir, %v for another", Marked(marked.Process.Pid, dir), Marked(marked.Process.Pid, dir+"-other"))
	}
	if Marked(plain.Process.Pid, dir) {
		t.Error("an unmarked child is Marked")
	}
	if l := Leftovers(dir, nil); slices.Contains(l, marked.Process.Pid) {
		t.Errorf("Leftovers %v holds a process younger than the caller", l)
	}
	_ = marked.Process.Kill()
	for deadline := time.Now().Add(5 * time.Second); Marked(marked.Process.Pid, dir); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a killed (zombie) process is still Marked")
		}
	}
}

func TestLockHolders(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if h := LockHolders(f); len(h) != 0 {
		t.Errorf("holders of an unlocked file: %v", h)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if h := LockHolders(f); !slices.Equal(h, []int{os.Getpid()}) {
		t.Errorf("holders = %v, want [%d]", h, os.Getpid())
	}
}

func TestCloseInheritedOnExec(t *testing.T) {
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY, 0) // no O_CLOEXEC: as inherited
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := CloseInheritedOnExec(); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("descriptor %d flags %#x (%v): want FD_CLOEXEC", fd, flags, err)
	}
}
