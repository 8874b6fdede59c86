package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/userns"
)

// fileID is what an open descriptor refers to (a socket's inode lives on
// sockfs, a file's on its filesystem).
type fileID struct{ dev, ino uint64 }

// daemonHoldings lists what no process but the daemon may hold: its
// listening sockets (unix and TCP: the API socket, HTTP, preview) and the
// files of its state directory it has open (the lock, SQLite and its WAL).
func daemonHoldings(t *testing.T, pid int, stateDir string) map[fileID]string {
	t.Helper()
	listening := map[uint64]bool{}
	for _, f := range []string{"net/unix", "net/tcp", "net/tcp6"} {
		for ino := range listeningInodes(t, pid, f) {
			listening[ino] = true
		}
	}
	out := map[fileID]string{}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := filepath.Join(fdDir, e.Name())
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			continue
		}
		target, _ := os.Readlink(p)
		switch {
		case st.Mode&syscall.S_IFMT == syscall.S_IFSOCK && listening[st.Ino]:
			out[fileID{st.Dev, st.Ino}] = "listening " + target
		case st.Mode&syscall.S_IFMT == syscall.S_IFREG && strings.HasPrefix(target, stateDir+"/"):
			out[fileID{st.Dev, st.Ino}] = target
		}
	}
	if len(out) < 3 {
		t.Fatalf("the daemon holds %v: want at least its socket, its lock and its database", out)
	}
	return out
}

// listeningInodes reads the inodes of listening sockets from a
// /proc/PID/net table (unix: the __SO_ACCEPTCON flag; tcp: state 0A).
func listeningInodes(t *testing.T, pid int, table string) map[uint64]bool {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/%s", pid, table))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[uint64]bool{}
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		var ino uint64
		switch {
		case table == "net/unix" && len(fs) >= 7 && fs[3] == "00010000":
			ino, _ = strconv.ParseUint(fs[6], 10, 64)
		case table != "net/unix" && len(fs) >= 10 && fs[3] == "0A":
			ino, _ = strconv.ParseUint(fs[9], 10, 64)
		}
		if ino != 0 {
			out[ino] = true
		}
	}
	return out
}

// holders lists the live processes that hold one of ids, and their pids.
func holders(ids map[fileID]string) (out []string, pids []int) {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, p := range fds {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			continue
		}
		if what, ok := ids[fileID{st.Dev, st.Ino}]; ok {
			pid := strings.Split(p, "/")[2]
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, fmt.Sprintf("pid %s (%s) holds %s", pid, strings.TrimSpace(string(comm)), what))
			n, _ := strconv.Atoi(pid)
			pids = append(pids, n)
		}
	}
	return out, pids
}

// TestCrashWhileUsernsOwnerLives: the daemon is killed while the child it
// forked to own a sandbox's user namespace is alive (between its fork and
// the daemon's kill of it). That child must die with the daemon, must not
// have held the daemon's listeners, lock or database meanwhile, and the
// daemon must come back at once.
func TestCrashWhileUsernsOwnerLives(t *testing.T) {
	d := testenv.NewDaemon(t)
	if d.Config.Sandbox.UsernsPool.Count == 0 {
		t.Fatal("the test configuration has no user namespace pool: the owner process is never forked")
	}
	d.ExtraEnv = []string{crashpoint.EnvVar + "=" + userns.CrashOwnerAlive}
	d.Start()
	held := daemonHoldings(t, d.PID(), d.Config.Paths.StateDir)
	marker := markerOf(d.Config.Paths.StateDir)

	// The create dies with the daemon at the crash point. Its client must
	// hear so: a leftover holding the daemon's end of the connection (or
	// its listener) would leave it waiting for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(d.Bin, "sandboxctl"), "--socket", d.Socket, "create", "--lang", "shell").CombinedOutput()
	switch {
	case ctx.Err() != nil:
		t.Errorf("the client of the create still waited 30s after the daemon died")
	case err == nil:
		t.Fatalf("create succeeded across the crash point: %s", out)
	}
	if err := d.WaitExited(30 * time.Second); err == nil {
		t.Fatal("the daemon exited cleanly: the crash point was not reached")
	}
	// A parent-death signal is delivered as the daemon dies; allow the
	// kernel a moment to finish the children off.
	var left []string
	var pids []int
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left, pids = holders(held); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) != 0 {
		t.Errorf("after the daemon died, other processes hold its descriptors:\n%s", strings.Join(left, "\n"))
		// End them, so that the rest of the test (and its leftovers
		// check) still runs.
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nor does any process of the daemon's survive: none of this test's
	// sandboxes got as far as a process of its own.
	if left := markedProcesses(marker); len(left) != 0 {
		t.Errorf("processes marked %s outlived the daemon: %v", marker, left)
	}

	d.ExtraEnv = nil
	start := time.Now()
	d.Start()
	took := time.Since(start)
	t.Logf("restart after the crash answered after %s", took)
	if took > 5*time.Second {
		t.Errorf("the restarted daemon answered after %s", took)
	}
	if out := d.MustCtl("exec", createSandbox(d), "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("exec after the restart: %q", out)
	}
}

// markerOf is the environment entry that marks the processes of the daemon
// of stateDir (docs/ARCHITECTURE.md, "Process lifetimes"); written out here
// rather than taken from pkg/lifetime, so that the test checks the contract.
func markerOf(stateDir string) string { return "SANDBOXD_DAEMON=" + stateDir }

// markedProcesses lists the live (not zombie) processes whose environment
// carries marker.
func markedProcesses(marker string) []int {
	var out []int
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range envs {
		b, err := os.ReadFile(p)
		if err != nil || !slices.Contains(strings.Split(string(b), "\x00"), marker) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
		out = append(out, pid)
	}
	return out
}

// startMarked starts argv as a process marked as one of the daemon of
// stateDir would be, holding files (from descriptor 3 on), and kills it
// when the test ends.
func startMarked(t *testing.T, marker string, files []*os.File, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), marker)
	cmd.ExtraFiles = files
	// Its own group, as a helper of the daemon would be.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	return cmd
}

func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(stat), ')')
	return err == nil && i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// TestRestartEndsLeftovers: after a crash, processes an earlier daemon of
// the same state directory left (marked; here one holding the state lock,
// one holding nothing, and a listener on the API socket's path) never keep
// the new daemon down: it ends the marked ones before it takes the lock,
// replaces the socket in one step, and keeps its sandboxes (adopted) and
// other daemons' processes alone.
func TestRestartEndsLeftovers(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	stateDir := d.Config.Paths.StateDir
	marker := markerOf(stateDir)
	if !slices.Contains(markedProcesses(marker), d.PID()) {
		t.Fatalf("the daemon (pid %d) does not carry %s", d.PID(), marker)
	}
	id := createSandbox(d)
	d.Crash()

	// A dead daemon's listener on the socket path, never accepting, held
	// by a leftover only (as by the forked child of issue 28).
	if err := os.Remove(d.Socket); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	staleFile, err := stale.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	stale.Close()
	var staleSt syscall.Stat_t
	if err := syscall.Stat(d.Socket, &staleSt); err != nil {
		t.Fatal(err)
	}
	lockHolder := startMarked(t, marker, []*os.File{staleFile}, "flock", filepath.Join(stateDir, "lock"), "sleep", "600")
	staleFile.Close()
	idle := startMarked(t, marker, nil, "sleep", "600")
	other := startMarked(t, markerOf(stateDir+"-other"), nil, "sleep", "600")
	// The lock is taken (flock forks its command, which holds it too).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile("/proc/locks"); strings.Contains(string(b), fmt.Sprintf(" %d ", lockHolder.Process.Pid)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in leftover never took the state lock")
		}
	}

	start := time.Now()
	d.Start()
	took := time.Since(start)
	t.Logf("restart with leftovers answered after %s", took)
	if took > 5*time.Second {
		t.Errorf("the restarted daemon answered after %s", took)
	}
	for _, c := range []*exec.Cmd{lockHolder, idle} {
		if alive(c.Process.Pid) {
			t.Errorf("the leftover %v (pid %d) is still alive", c.Args, c.Process.Pid)
		}
	}
	if !alive(other.Process.Pid) {
		t.Errorf("the process of another state directory's daemon was killed")
	}
	// The socket path is the new daemon's, not the dead listener.
	var st syscall.Stat_t
	if err := syscall.Stat(d.Socket, &st); err != nil || st.Ino == staleSt.Ino {
		t.Errorf("the socket path still names the dead listener (inode %d, %v)", st.Ino, err)
	}
	if res, err := d.UnixGet("/healthz"); err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("healthz on the socket: %v %v", res, err)
	}
	if _, err := os.Stat(d.Socket + ".new"); !os.IsNotExist(err) {
		t.Errorf("the socket's temporary name is left: %v", err)
	}
	if st, err := os.Stat(d.Socket); err != nil || st.Mode().Perm() != d.Config.Server.SocketPerm() {
		t.Errorf("socket after restart: %v, mode %v, want %v", err, st.Mode().Perm(), d.Config.Server.SocketPerm())
	}
	if b, _ := os.ReadFile(filepath.Join(stateDir, "lock")); strings.TrimSpace(string(b)) != strconv.Itoa(d.PID()) {
		t.Errorf("the lock file names %q, want the daemon's pid %d", b, d.PID())
	}
	// The sandbox survived and is adopted.
	if out := d.MustCtl("exec", id, "--", "echo", "adopted"); out != "adopted\n" {
		t.Errorf("exec in the sandbox after the restart: %q", out)
	}
}

// TestLockNamesALiveDaemon: the state lock refuses a second daemon while
// the first lives (and the refused start harms nothing), and a lock file
// naming a dead or unrelated process never keeps a daemon down; a lock held
// by a process that is no daemon of this directory is reported with its
// pid, at once, instead of being waited for.
func TestLockNamesALiveDaemon(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	first := d.PID()
	start := time.Now()
	out, err := exec.Command(filepath.Join(d.Bin, "mcp-sandboxd"), "serve", "--config", d.CfgPath).CombinedOutput()
	if want := fmt.Sprintf("in use by another mcp-sandboxd (pid %d)", first); err == nil || !strings.Contains(string(out), want) {
		t.Errorf("second daemon: err %v, output %s; want %q", err, out, want)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the second daemon took %s to give up", took)
	}
	if res, err := d.UnixGet("/healthz"); err != nil || res.StatusCode != http.StatusOK || !alive(first) {
		t.Fatalf("the first daemon after a second one was refused: %v %v", res, err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}

	lock := filepath.Join(d.Config.Paths.StateDir, "lock")
	// A dead pid, then a live process that is not a daemon (this test).
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{dead.Process.Pid, os.Getpid()} {
		if err := os.WriteFile(lock, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d.Start()
		if b, _ := os.ReadFile(lock); strings.TrimSpace(string(b)) != strconv.Itoa(d.PID()) {
			t.Errorf("lock file naming %d: after the start it names %q, want %d", pid, b, d.PID())
		}
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
	}

	// Held by a process of no daemon (this test): refused, naming it.
	f, err := os.OpenFile(lock, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	out, err = exec.Command(filepath.Join(d.Bin, "mcp-sandboxd"), "serve", "--config", d.CfgPath).CombinedOutput()
	if want := fmt.Sprintf("locked by pid [%d]", os.Getpid()); err == nil || !strings.Contains(string(out), want) {
		t.Errorf("daemon on a lock held by pid %d: err %v, output %s; want %q", os.Getpid(), err, out, want)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the daemon took %s to give up on a foreign lock", took)
	}
	if !alive(os.Getpid()) {
		t.Fatal("unreachable")
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
