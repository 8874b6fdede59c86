package mcpserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestSnapshotTools drives the snapshot tools through MCP: snapshot,
// change, restore, fork, list, delete, and the errors naming their field.
func TestSnapshotTools(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	sh := func(id, cmd string) string {
		t.Helper()
		return ok[execOut](c, "exec_command", map[string]any{"sandbox_id": id, "command": cmd}).Stdout
	}
	id := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "python"}).ID
	sh(id, "echo one > /workspace/f; mkdir /workspace/d; echo two > /workspace/d/g")
	const sum = "sha256sum /workspace/f /workspace/d/g; ls /workspace"
	want := sh(id, sum)

	snap := ok[apitypes.Snapshot](c, "sandbox_snapshot", map[string]any{"sandbox_id": id, "name": "v1"})
	if len(snap.ID) != 64 || snap.Size <= 0 || snap.CreatedAt.IsZero() || snap.SandboxID != id {
		t.Fatalf("snapshot %+v", snap)
	}
	sh(id, "echo changed > /workspace/f; rm -r /workspace/d; touch /workspace/new")
	ok[sandboxTerminateOut](c, "sandbox_restore", map[string]any{"sandbox_id": id, "snapshot_id": snap.ID})
	if got := sh(id, sum); got != want {
		t.Errorf("after restore %q, want %q", got, want)
	}
	fork := ok[sandboxOut](c, "sandbox_create", map[string]any{"from_snapshot": snap.ID})
	if fork.Language != "python" {
		t.Errorf("fork language %q", fork.Language)
	}
	if got := sh(fork.ID, sum); got != want {
		t.Errorf("fork %q, want %q", got, want)
	}
	l := ok[snapshotListOut](c, "snapshot_list", map[string]any{"sandbox_id": id})
	if len(l.Snapshots) != 1 || l.Snapshots[0].ID != snap.ID || l.Snapshots[0].Name != "v1" {
		t.Errorf("list %+v", l)
	}

	shell := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"}).ID
	for _, tc := range []struct {
		tool        string
		args        map[string]any
		code, field string
	}{
		{"sandbox_snapshot", map[string]any{"sandbox_id": id, "name": "no spaces"}, "invalid_argument", "name"},
		{"sandbox_restore", map[string]any{"sandbox_id": shell, "snapshot_id": snap.ID}, "invalid_argument", "snapshot_id"},
		{"sandbox_restore", map[string]any{"sandbox_id": id, "snapshot_id": strings.Repeat("0", 64)}, "not_found", "snapshot_id"},
		{"sandbox_create", map[string]any{"from_snapshot": "nope"}, "invalid_argument", "from_snapshot"},
		{"snapshot_delete", map[string]any{"snapshot_id": strings.Repeat("1", 64)}, "not_found", "snapshot_id"},
	} {
		code, msg := errCode(t, c.call(tc.tool, tc.args, nil))
		if code != tc.code || !strings.HasPrefix(msg, tc.field+":") {
			t.Errorf("%s %v: %s %q, want %s naming %s", tc.tool, tc.args, code, msg, tc.code, tc.field)
		}
	}

	ok[snapshotDeleteOut](c, "snapshot_delete", map[string]any{"snapshot_id": snap.ID})
	archive := filepath.Join(e.Config().Paths.StateDir, "snapshots", snap.ID+".tar.zst")
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Errorf("archive after snapshot_delete: %v", err)
	}
	if l := ok[snapshotListOut](c, "snapshot_list", map[string]any{}); len(l.Snapshots) != 0 {
		t.Errorf("list after delete: %+v", l)
	}
}
