package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
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
