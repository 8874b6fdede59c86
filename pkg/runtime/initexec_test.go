package runtime

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestMain lets this test binary act as a container's init if the
// hand-over to sandbox-init does not happen (the test then fails on the
// init's /proc/<pid>/exe instead of running the tests inside a sandbox).
func TestMain(m *testing.M) {
	MaybeInit()
	os.Exit(m.Run())
}

// TestInitBinarySealed starts a container's init through the runtime's
// sealed sandbox-init and holds it where runc holds every init before the
// start (waiting on its exec fifo), then checks the boundary of initexec.go:
// the init runs sandbox-init from the sealed memfd, not the daemon and not
// the file on disk; neither root of the host through /proc/<pid>/exe nor
// root of the container through /proc/1/exe can write it; the memfd is no
// descriptor of the init nor of PID 1 afterwards, which holds nothing in its
// place; and the host's sandbox-init is unchanged.
func TestInitBinarySealed(t *testing.T) {
	cfg := testenv.Config(t, "rtinit")
	shell := testenv.EnsureImages(t, "shell")["shell"]
	initBin := filepath.Join(filepath.Dir(testenv.AgentPath(t)), InitBinaryName)
	before := fileSum(t, initBin)

	r, err := New(filepath.Join(cfg.Paths.RunDir, "runtime"), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UseInitBinary(initBin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	t.Cleanup(func() { testenv.AssertNoLeftovers(t, cfg) })

	id := "sb-" + testenv.RandHex(6)
	_, lcfg, err := r.containerConfig(&Spec{
		ID: id, Rootfs: shell.Rootfs, CgroupPath: cfg.Sandbox.CgroupParent + "/" + id,
		InitArgs: []string{"/bin/sh"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ct, err := libcontainer.Create(r.Root, id, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ct.Signal(unix.SIGKILL)
		if err := ct.Destroy(); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	// PID 1 lists its descriptors: 0-2 and ls's own directory, which
	// takes the lowest free number, 3, where the memfd was passed.
	var out bytes.Buffer
	proc := &libcontainer.Process{
		Args: []string{"/bin/sh", "-c", "ls /proc/self/fd | tr '\\n' ' '"},
		Env:  []string{"PATH=/usr/bin:/bin"}, Cwd: "/", Init: true, Stdout: &out, Stderr: &out,
	}
	r.withInitExe(proc)
	if len(proc.ExtraFiles) != 1 {
		t.Fatalf("the sealed sandbox-init was not passed: %d extra files", len(proc.ExtraFiles))
	}
	if err := ct.Start(proc); err != nil {
		t.Fatal(err)
	}
	pid, err := proc.Pid()
	if err != nil {
		t.Fatal(err)
	}
	exe := "/proc/" + strconv.Itoa(pid) + "/exe"

	// What the init runs: the memfd, sandbox-init's exact bytes.
	if link, err := os.Readlink(exe); err != nil || link != "/memfd:runc_cloned:"+initMemfdName+" (deleted)" {
		t.Fatalf("the init runs %q (%v), not the sealed sandbox-init", link, err)
	}
	if got := fileSum(t, exe); got != before {
		t.Error("the init's binary differs from sandbox-init")
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	f.Close()
	want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if err != nil || seals&want != want {
		t.Errorf("seals of the init's binary: %#x (%v), want %#x", seals, err, want)
	}

	// Root of the host cannot write it, by open or by truncation.
	for _, flag := range []int{os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND} {
		w, err := os.OpenFile(exe, flag, 0)
		if err == nil {
			_, err = w.Write([]byte("\x7fELF overwritten"))
			w.Close()
		}
		if err == nil {
			t.Errorf("host root wrote the init's binary with flags %#x", flag)
		} else if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ETXTBSY) {
			t.Errorf("writing the init's binary (flags %#x): %v, want EPERM or ETXTBSY", flag, err)
		}
	}

	// No descriptor of the init is the memfd (it was made close-on-exec
	// before sandbox-init ran).
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); strings.Contains(l, "memfd:") {
			t.Errorf("the init holds descriptor %s: %s", fd.Name(), l)
		}
	}

	// Root of the container (all of the runtime's capabilities, no user
	// namespace: the strongest tenant) cannot write it through /proc/1/exe.
	var inside bytes.Buffer
	attacker := &libcontainer.Process{
		Args: []string{"/bin/sh", "-c", "printf x >> /proc/1/exe && echo WROTE; printf x > /proc/1/exe && echo TRUNCATED; echo done"},
		Env:  []string{"PATH=/usr/bin:/bin"}, Cwd: "/", Stdout: &inside, Stderr: &inside,
	}
	if err := ct.Run(attacker); err != nil {
		t.Fatal(err)
	}
	if _, err := attacker.Wait(); err != nil {
		t.Fatalf("attacker: %v: %s", err, inside.String())
	}
	if s := inside.String(); !strings.Contains(s, "done") || strings.Contains(s, "WROTE") || strings.Contains(s, "TRUNCATED") {
		t.Errorf("a write to /proc/1/exe from inside the container: %q", s)
	}
	if got := fileSum(t, exe); got != before {
		t.Error("the init's binary changed")
	}

	// Start PID 1: besides 0-2 and ls's own directory it holds nothing,
	// the memfd's slot included.
	if err := ct.Exec(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := proc.Wait(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("PID 1: %v: %s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("PID 1 did not exit")
	}
	if got := strings.TrimSpace(out.String()); got != "0 1 2 3" {
		t.Errorf("PID 1's descriptors: %q, want 0 1 2 3 (3: ls's directory)", got)
	}
	if after := fileSum(t, initBin); after != before {
		t.Error("the host's sandbox-init changed")
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}
