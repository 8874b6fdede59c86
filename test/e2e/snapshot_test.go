package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

var snapshotIDRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// TestSnapshotCLI drives snapshots through sandboxctl and the daemon,
// across a daemon restart (the sandbox is adopted, the snapshot is kept):
// snapshot, change, restart, restore, fork, list, delete, and bad input.
func TestSnapshotCLI(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	d.MustCtl("exec", id, "--", "sh", "-c", "mkdir -p /workspace/a/b && seq 1 5000 > /workspace/a/b/n && echo hi > /workspace/h && ln -s a/b/n /workspace/l")
	const sum = "cd /workspace && find . | sort && sha256sum a/b/n h l"
	want := d.MustCtl("exec", id, "--", "sh", "-c", sum)

	snap := strings.TrimSpace(d.MustCtl("snapshot", id, "--name", "before-change"))
	if !snapshotIDRe.MatchString(snap) {
		t.Fatalf("snapshot printed %q", snap)
	}
	d.MustCtl("exec", id, "--", "sh", "-c", "rm -r /workspace/a && echo bye > /workspace/h && touch /workspace/extra")
	if d.MustCtl("exec", id, "--", "sh", "-c", "cd /workspace && find . | sort") == want {
		t.Fatal("the change changed nothing")
	}

	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Start()
	if out := d.MustCtl("restore", id, snap); strings.TrimSpace(out) != id+" ready" {
		t.Errorf("restore printed %q", out)
	}
	if got := d.MustCtl("exec", id, "--", "sh", "-c", sum); got != want {
		t.Errorf("after restore (and a daemon restart):\n%s\nwant:\n%s", got, want)
	}
	fork := createSandbox(d, "--from-snapshot", snap)
	if got := d.MustCtl("exec", fork, "--", "sh", "-c", sum); got != want {
		t.Errorf("fork:\n%s\nwant:\n%s", got, want)
	}

	var list []struct {
		ID        string `json:"snapshot_id"`
		Name      string `json:"name"`
		SandboxID string `json:"sandbox_id"`
		Size      int64  `json:"size"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("snapshots", "ls", "--json", "--sandbox", id)), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != snap || list[0].Name != "before-change" || list[0].SandboxID != id || list[0].Size <= 0 {
		t.Errorf("snapshots ls: %+v", list)
	}
	if out := d.MustCtl("snapshots", "ls"); !strings.Contains(out, snap) || !strings.Contains(out, "before-change") {
		t.Errorf("snapshots ls table:\n%s", out)
	}

	_, stderr, code := d.Ctl("snapshot", id, "--name", "../x")
	if code == 0 || !strings.Contains(stderr, "name:") {
		t.Errorf("bad name: exit %d, %q", code, stderr)
	}
	_, stderr, code = d.Ctl("restore", id, strings.Repeat("f", 64))
	if code == 0 || !strings.Contains(stderr, "snapshot_id:") {
		t.Errorf("unknown snapshot: exit %d, %q", code, stderr)
	}

	d.MustCtl("snapshots", "rm", snap)
	if _, err := os.Stat(filepath.Join(d.Config.Paths.StateDir, "snapshots", snap+".tar.zst")); !os.IsNotExist(err) {
		t.Errorf("archive after snapshots rm: %v", err)
	}
	if out := d.MustCtl("snapshots", "ls"); strings.Contains(out, snap) {
		t.Errorf("deleted snapshot still listed:\n%s", out)
	}
}

// freezerState returns a function reading a sandbox's freezer state
// ("FROZEN"/"THAWED" on v1, "1"/"0" on v2), also while the daemon is down.
func freezerState(t *testing.T, d *testenv.Daemon, id string) func() string {
	t.Helper()
	var sb struct {
		CgroupPath string `json:"cgroup_path"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &sb); err != nil || sb.CgroupPath == "" {
		t.Fatalf("inspect %s: %+v %v", id, sb, err)
	}
	return func() string {
		t.Helper()
		for _, f := range []string{
			filepath.Join("/sys/fs/cgroup/freezer", sb.CgroupPath, "freezer.state"),
			filepath.Join("/sys/fs/cgroup", sb.CgroupPath, "cgroup.freeze"),
		} {
			if b, err := os.ReadFile(f); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		t.Fatalf("no freezer state for %s", id)
		return ""
	}
}

// TestCrashWhileFrozen kills the daemon while a snapshot or a restore has
// the sandbox frozen: after the restart the sandbox runs again (thawed by
// reconciliation), the unrecorded archive is gone, and both operations
// work again.
func TestCrashWhileFrozen(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	d.MustCtl("exec", id, "--", "sh", "-c", "seq 1 10000 > /workspace/n")
	const sum = "sha256sum /workspace/n; ls /workspace"
	want := d.MustCtl("exec", id, "--", "sh", "-c", sum)
	frozenState := freezerState(t, d, id)
	crashIn := func(point string, args ...string) {
		t.Helper()
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.ExtraEnv = []string{crashpoint.EnvVar + "=" + point}
		d.Start()
		if out, _, code := d.Ctl(args...); code == 0 {
			t.Fatalf("%v succeeded (%q) although the daemon was to crash at %s", args, out, point)
		}
		if err := d.WaitExited(30 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("daemon exit: %v, want killed by its crash point", err)
		}
		if s := frozenState(); s != "FROZEN" && s != "1" {
			t.Fatalf("crash point %s: the sandbox is %q, want frozen at the crash", point, s)
		}
		d.ExtraEnv = nil
		d.Start()
		if s := frozenState(); s == "FROZEN" || s == "1" {
			t.Errorf("after the restart the sandbox is still frozen (%q)", s)
		}
		if got := d.MustCtl("exec", id, "--", "echo", "alive"); got != "alive\n" {
			t.Errorf("exec after the restart: %q", got)
		}
	}

	crashIn(engine.CrashSnapshotFrozen, "snapshot", id)
	if out := d.MustCtl("snapshots", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("snapshots after a crash mid-snapshot: %s", out)
	}
	dir := filepath.Join(d.Config.Paths.StateDir, "snapshots")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in %s after the restart: %v", dir, ents)
	}

	snap := strings.TrimSpace(d.MustCtl("snapshot", id))
	d.MustCtl("exec", id, "--", "sh", "-c", "rm /workspace/n; touch /workspace/x")
	crashIn(engine.CrashRestoreFrozen, "restore", id, snap)
	d.MustCtl("restore", id, snap)
	if got := d.MustCtl("exec", id, "--", "sh", "-c", sum); got != want {
		t.Errorf("after a crash mid-restore and a second restore:\n%s\nwant:\n%s", got, want)
	}
}
