package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

	d.ExtraEnv = nil
	start := time.Now()
	d.Start()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the restarted daemon answered after %s", took)
	}
	if out := d.MustCtl("exec", createSandbox(d), "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("exec after the restart: %q", out)
	}
}
