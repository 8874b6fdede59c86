package lifetime

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
		t.Errorf("holders of a file only the caller has open: %v", h)
	}
	// A child that inherited the locked descriptor holds the lock after
	// the process that took it is gone: flock(1) forks sleep.
	cmd := exec.Command("flock", f.Name(), "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL); _ = cmd.Wait() })
	var h []int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if h = LockHolders(f); len(h) == 2 {
			break
		}
	}
	if len(h) != 2 || !slices.Contains(h, cmd.Process.Pid) {
		t.Fatalf("holders = %v, want flock (%d) and its sleep", h, cmd.Process.Pid)
	}
	// flock itself killed: its sleep still holds the lock, and is named.
	_ = unix.Kill(cmd.Process.Pid, unix.SIGKILL)
	_ = cmd.Wait()
	if h = LockHolders(f); len(h) != 1 || h[0] == cmd.Process.Pid {
		t.Errorf("holders after flock died = %v, want its sleep only", h)
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

// helperEnv makes the test binary a parent that starts `sleep` with
// DieWithParent, prints its pid and waits to be killed.
const helperEnv = "LIFETIME_TEST_PARENT"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = DieWithParent()
		if err := cmd.Start(); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString(strconv.Itoa(cmd.Process.Pid) + "\n")
		select {}
	}
	os.Exit(m.Run())
}

// TestDieWithParent: a helper started with DieWithParent dies when its
// parent is killed with SIGKILL.
func TestDieWithParent(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), helperEnv+"=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = parent.Process.Kill()
		t.Fatalf("the parent printed no pid: %v", err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(line))
	t.Cleanup(func() { _ = unix.Kill(child, unix.SIGKILL) })
	if _, st, ok := stat(child); !ok || st == 'Z' {
		t.Fatalf("the helper %d is not running", child)
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// Re-parented to init (or a subreaper), it is reaped there.
		if _, st, ok := stat(child); !ok || st == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the helper %d outlived its parent by 5s", child)
		}
	}
}
