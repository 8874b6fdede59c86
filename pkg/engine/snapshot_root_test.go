package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestSnapshotForkOfRootMode: a fork (sandbox_create from_snapshot, without
// root) of a snapshot of a root-mode sandbox can write /workspace and the
// files root made there, which become its user's; the same snapshot forked
// in root mode keeps them root's. Found by make chaos ("permission
// denied" on the fork's first write).
func TestSnapshotForkOfRootMode(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	src := env.create(t, CreateSandboxRequest{Root: true})
	fill := `set -e; id -u; mkdir -p /workspace/dir /tmp/rootdir; echo one > /workspace/dir/a.txt; echo t > /tmp/rootdir/t.txt
echo etc > /etc/made-by-root; chmod 644 /workspace/dir/a.txt`
	if res := env.sh(t, src.ID, fill); res.ExitCode != 0 || strings.TrimSpace(strings.Split(res.Stdout, "\n")[0]) != "0" {
		t.Fatalf("fill as root: exit %d: %s %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	snap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: src.ID})
	if err != nil {
		t.Fatal(err)
	}

	fork := env.create(t, CreateSandboxRequest{FromSnapshot: snap.ID})
	uid := strings.TrimSpace(env.sh(t, fork.ID, "id -u").Stdout)
	if uid == "0" || uid == "" {
		t.Fatalf("the fork's user is %q, want the unprivileged sandbox user", uid)
	}
	write := `set -e; echo new > /workspace/new.txt; echo two >> /workspace/dir/a.txt; echo b > /workspace/dir/b.txt
echo u > /tmp/rootdir/u.txt; cat /workspace/dir/a.txt /etc/made-by-root`
	if res := env.sh(t, fork.ID, write); res.ExitCode != 0 || res.Stdout != "one\ntwo\netc\n" {
		t.Fatalf("writes in the fork of a root-mode snapshot: exit %d: %q %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	owners := "stat -c '%n %u:%g' /workspace /workspace/dir /workspace/dir/a.txt /tmp/rootdir /tmp/rootdir/t.txt /etc/made-by-root"
	want := strings.Join([]string{
		"/workspace " + uid + ":" + uid, "/workspace/dir " + uid + ":" + uid, "/workspace/dir/a.txt " + uid + ":" + uid,
		"/tmp/rootdir " + uid + ":" + uid, "/tmp/rootdir/t.txt " + uid + ":" + uid, "/etc/made-by-root 0:0",
	}, "\n") + "\n"
	if res := env.sh(t, fork.ID, owners); res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("owners in the fork: exit %d:\n%s%s\nwant:\n%s", res.ExitCode, res.Stdout, res.Stderr, want)
	}

	// Forked in root mode, root's files stay root's.
	rootFork := env.create(t, CreateSandboxRequest{FromSnapshot: snap.ID, Root: true})
	wantRoot := "/workspace 0:0\n/workspace/dir 0:0\n/workspace/dir/a.txt 0:0\n/tmp/rootdir 0:0\n/tmp/rootdir/t.txt 0:0\n/etc/made-by-root 0:0\n"
	if res := env.sh(t, rootFork.ID, owners); res.ExitCode != 0 || res.Stdout != wantRoot {
		t.Errorf("owners in the root-mode fork: exit %d:\n%s%s\nwant:\n%s", res.ExitCode, res.Stdout, res.Stderr, wantRoot)
	}
}
