package engine

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// manifestScript prints every entry of /workspace and /tmp with its type,
// mode, owner, link count and (files) sha256 or (symlinks) target: what a
// restore must give back.
const manifestScript = `cd / && find workspace tmp -mindepth 1 -printf '%p %y %m %U:%G %n %l\n' | sort && find workspace tmp -type f -exec sha256sum {} + | sort -k2`

// fillScript makes a workspace with nested dirs, binary and text files, an
// empty file, a symlink, a hard link, odd modes, and a file in /tmp.
const fillScript = `set -e
mkdir -p /workspace/proj/src/deep /workspace/empty-dir
head -c 300000 /dev/urandom > /workspace/proj/blob.bin
seq 1 20000 > /workspace/proj/src/numbers.txt
echo keep > /workspace/keep.txt
echo delete-me > /workspace/del.txt
: > /workspace/proj/src/deep/empty
chmod 600 /workspace/keep.txt
chmod 750 /workspace/proj/src
ln -s proj/src/numbers.txt /workspace/link
ln /workspace/proj/src/numbers.txt /workspace/proj/hardlink
echo in-tmp > /tmp/t.txt`

type agentJob = agent.JobInfo

func (env *testEnv) manifest(t *testing.T, id string) string {
	t.Helper()
	res := env.sh(t, id, manifestScript)
	if res.ExitCode != 0 || res.Stdout == "" {
		t.Fatalf("manifest of %s: exit %d: %s %s", id, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func mustCode(t *testing.T, what string, err error, code errdefs.Code, field string) {
	t.Helper()
	if errdefs.CodeOf(err) != code || !strings.HasPrefix(errdefs.MessageOf(err), field+":") {
		t.Errorf("%s: got %v; want %s naming %s", what, err, code, field)
	}
}

// TestSnapshotRestoreFork is the acceptance path: snapshot → change files
// (modify, delete, add) → restore gives back the snapshot's bytes; a fork
// has the files on its own disk; a deleted snapshot's archive is gone; bad
// input gets taxonomy errors naming the field.
func TestSnapshotRestoreFork(t *testing.T) {
	env := newTestEngine(t)
	testenv.EnsureImages(t, "python")
	ctx := context.Background()
	src := env.create(t, CreateSandboxRequest{})
	if res := env.sh(t, src.ID, fillScript); res.ExitCode != 0 {
		t.Fatalf("fill: %s", res.Stderr)
	}
	want := env.manifest(t, src.ID)

	snap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: src.ID, Name: "base-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.ID) != 64 || snap.Size <= 0 || snap.ContentSize < 300000 || snap.Name != "base-1" || snap.Language != "shell" || snap.ImageDigest == "" {
		t.Fatalf("snapshot %+v", snap)
	}
	archive := filepath.Join(env.cfg.Paths.StateDir, "snapshots", snap.ID+".tar.zst")
	if fi, err := os.Stat(archive); err != nil || fi.Size() != snap.Size {
		t.Fatalf("archive %s: %v (size %d, recorded %d)", archive, err, fi.Size(), snap.Size)
	}
	if d, _ := env.GetSandbox(ctx, src.ID); d.State != sandbox.StateReady {
		t.Errorf("after a snapshot the sandbox is %s, want ready (thawed)", d.State)
	}

	// Change: modify, delete, add, in /workspace and /tmp; and leave a
	// command running, which the restore must stop.
	change := `set -e; echo changed >> /workspace/keep.txt; rm /workspace/del.txt /tmp/t.txt
rm -r /workspace/proj/src/deep; echo new > /workspace/new.txt; head -c 1000 /dev/zero > /workspace/proj/blob.bin`
	if res := env.sh(t, src.ID, change); res.ExitCode != 0 {
		t.Fatalf("change: %s", res.Stderr)
	}
	if env.manifest(t, src.ID) == want {
		t.Fatal("the change changed nothing")
	}
	if _, err := env.StartJob(ctx, ExecRequest{SandboxID: src.ID, Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	// And a foreground command in flight: the restore waits for it to end.
	fg := make(chan *sandbox.ExecResult, 1)
	go func() {
		res, err := env.Exec(ctx, ExecRequest{SandboxID: src.ID, Command: "sleep 999"}, nil)
		if err != nil {
			t.Errorf("foreground command: %v", err)
		}
		fg <- res
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		jobs, err := env.sandboxes.Jobs(ctx, src.ID)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(jobs, func(j agentJob) bool { return j.Exit == nil && slices.Contains(j.Argv, "sleep 999") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the foreground command did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	restored, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: src.ID, SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if restored.ID != src.ID || !restored.State.Live() {
		t.Errorf("restored sandbox %+v", restored)
	}
	if got := env.manifest(t, src.ID); got != want {
		t.Errorf("after restore:\n%s\nwant:\n%s", got, want)
	}
	select {
	case res := <-fg:
		if res != nil && res.Termination.Cause != sandbox.CauseKilled && res.Termination.Cause != sandbox.CauseSignal {
			t.Errorf("foreground command ended with %+v, want killed", res.Termination)
		}
	case <-time.After(10 * time.Second):
		t.Error("the foreground command outlived the restore")
	}
	jobs, err := env.sandboxes.Jobs(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Exit == nil && slices.Contains(j.Argv, "sleep 1000") {
			t.Errorf("job %s still running after the restore", j.ID)
		}
	}

	// A fork: same files, its own identity and disk.
	fork := env.create(t, CreateSandboxRequest{FromSnapshot: snap.ID})
	if fork.Language != "shell" || fork.ID == src.ID || fork.FromSnapshot != snap.ID {
		t.Fatalf("fork %+v", fork)
	}
	if got := env.manifest(t, fork.ID); got != want {
		t.Errorf("fork:\n%s\nwant:\n%s", got, want)
	}
	if res := env.sh(t, fork.ID, "cat /etc/hostname"); strings.TrimSpace(res.Stdout) != fork.ID {
		t.Errorf("fork's /etc/hostname is %q, want its own id", res.Stdout)
	}
	if res := env.sh(t, fork.ID, "echo fork-only > /workspace/keep.txt; echo x > /workspace/forked"); res.ExitCode != 0 {
		t.Fatal(res.Stderr)
	}
	if got := env.manifest(t, src.ID); got != want {
		t.Errorf("a write in the fork changed the source:\n%s", got)
	}
	for _, id := range []string{src.ID, fork.ID} {
		if _, err := os.Stat(filepath.Join(env.cfg.Paths.SandboxesDirOrDefault(), id+".img")); err != nil {
			t.Errorf("disk image of %s: %v", id, err)
		}
	}
	// A fork on a tmpfs works too.
	mem := env.create(t, CreateSandboxRequest{FromSnapshot: snap.ID, DiskBacking: "memory"})
	if got := env.manifest(t, mem.ID); got != want {
		t.Errorf("memory-backed fork:\n%s\nwant:\n%s", got, want)
	}
	// Snapshot and restore on the tmpfs as well.
	if _, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: mem.ID}); err != nil {
		t.Fatalf("snapshot of a memory-backed sandbox: %v", err)
	}
	if res := env.sh(t, mem.ID, change); res.ExitCode != 0 {
		t.Fatalf("change: %s", res.Stderr)
	}
	if _, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: mem.ID, SnapshotID: snap.ID}); err != nil {
		t.Fatalf("restore of a memory-backed sandbox: %v", err)
	}
	if got := env.manifest(t, mem.ID); got != want {
		t.Errorf("memory-backed sandbox after restore:\n%s\nwant:\n%s", got, want)
	}

	list, err := env.ListSnapshots(ctx, src.ID)
	if err != nil || len(list) != 1 || list[0].ID != snap.ID {
		t.Fatalf("list: %v %+v", err, list)
	}
	if other, _ := env.ListSnapshots(ctx, fork.ID); len(other) != 0 {
		t.Errorf("snapshots of the fork: %+v", other)
	}

	// Bad input.
	py := env.create(t, CreateSandboxRequest{Language: "python"})
	pysnap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: py.ID})
	if err != nil {
		t.Fatal(err)
	}
	_, err = env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: src.ID, SnapshotID: pysnap.ID})
	mustCode(t, "restore from another language's snapshot", err, errdefs.InvalidArgument, "snapshot_id")
	_, err = env.CreateSandbox(ctx, CreateSandboxRequest{FromSnapshot: pysnap.ID, Language: "shell"})
	mustCode(t, "fork in another language", err, errdefs.InvalidArgument, "language")
	unknown := strings.Repeat("ab", 32)
	_, err = env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: src.ID, SnapshotID: unknown})
	mustCode(t, "restore from an unknown snapshot", err, errdefs.NotFound, "snapshot_id")
	_, err = env.CreateSandbox(ctx, CreateSandboxRequest{FromSnapshot: unknown})
	mustCode(t, "fork of an unknown snapshot", err, errdefs.NotFound, "from_snapshot")
	_, err = env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: src.ID, SnapshotID: "../../etc"})
	mustCode(t, "malformed snapshot id", err, errdefs.InvalidArgument, "snapshot_id")
	_, err = env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: src.ID, Name: "bad/name"})
	mustCode(t, "name with a slash", err, errdefs.InvalidArgument, "name")
	if _, err := env.TerminateSandbox(ctx, py.ID); err != nil {
		t.Fatal(err)
	}
	_, err = env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: py.ID})
	mustCode(t, "snapshot of a terminated sandbox", err, errdefs.Conflict, "sandbox_id")
	_, err = env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: py.ID, SnapshotID: pysnap.ID})
	mustCode(t, "restore of a terminated sandbox", err, errdefs.Conflict, "sandbox_id")

	// Delete: the row and the archive go; the fork keeps its files.
	if err := env.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Errorf("archive after delete: %v", err)
	}
	_, err = env.GetSnapshot(ctx, snap.ID)
	mustCode(t, "get a deleted snapshot", err, errdefs.NotFound, "snapshot_id")
	mustCode(t, "delete twice", env.DeleteSnapshot(ctx, snap.ID), errdefs.NotFound, "snapshot_id")
	if res := env.sh(t, fork.ID, "cat /workspace/forked"); res.Stdout != "x\n" {
		t.Errorf("fork after the snapshot's deletion: %q", res.Stdout)
	}
}

// TestSnapshotExpiry: the janitor deletes snapshots older than
// snapshots.max_age, row and archive, and archives without a row.
func TestSnapshotExpiry(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) { c.Snapshots.MaxAge = config.Duration(2 * time.Second) })
	ctx := context.Background()
	sb := env.create(t, CreateSandboxRequest{})
	snap, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if snap.ExpiresAt == nil || snap.ExpiresAt.Sub(snap.CreatedAt) != 2*time.Second {
		t.Errorf("expires_at %v, created_at %v", snap.ExpiresAt, snap.CreatedAt)
	}
	archive := filepath.Join(env.cfg.Paths.StateDir, "snapshots", snap.ID+".tar.zst")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := env.GetSnapshot(ctx, snap.ID)
		_, ferr := os.Stat(archive)
		if errdefs.CodeOf(err) == errdefs.NotFound && os.IsNotExist(ferr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot not expired after 15 s: %v, archive %v", err, ferr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// BenchmarkSnapshot50MB: snapshot and restore of a workspace of ~50 MB
// (half random bytes, half text), median of b.N each.
func BenchmarkSnapshot50MB(b *testing.B) {
	env := newTestEngine(b)
	ctx := context.Background()
	info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		b.Fatal(err)
	}
	res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: `set -e; mkdir -p /workspace/data
for i in $(seq 1 25); do head -c 1000000 /dev/urandom > /workspace/data/r$i; done
for i in $(seq 1 25); do seq $((i*1000000)) $((i*1000000+140000)) > /workspace/data/t$i.txt; done
du -sm /workspace`}, nil)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("fill: %v %+v", err, res)
	}
	b.Logf("workspace: %s", strings.TrimSpace(res.Stdout))
	var snaps, restores []time.Duration
	var size int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// A different byte each round: a new snapshot, not the same one.
		if _, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: "date +%N > /workspace/round"}, nil); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		s, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: info.ID})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := env.RestoreSandbox(ctx, apitypes.RestoreRequest{SandboxID: info.ID, SnapshotID: s.ID}); err != nil {
			b.Fatal(err)
		}
		snaps, restores = append(snaps, t1.Sub(t0)), append(restores, time.Since(t1))
		size = s.Size
		if err := env.DeleteSnapshot(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(median(snaps), "snapshot-ms")
	b.ReportMetric(median(restores), "restore-ms")
	b.ReportMetric(float64(size)/(1<<20), "archive-MiB")
}

// TestSnapshotSizeCap: a snapshot larger than snapshots.max_size fails
// with limit_exceeded and leaves no archive, and the sandbox runs on.
func TestSnapshotSizeCap(t *testing.T) {
	env := newTestEngine(t, func(c *config.Config) { c.Snapshots.MaxSize = 64 << 10 })
	ctx := context.Background()
	sb := env.create(t, CreateSandboxRequest{})
	if res := env.sh(t, sb.ID, "head -c 200000 /dev/urandom > /workspace/r"); res.ExitCode != 0 {
		t.Fatal(res.Stderr)
	}
	_, err := env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: sb.ID})
	mustCode(t, "snapshot over the cap", err, errdefs.LimitExceeded, "sandbox_id")
	if ents, _ := os.ReadDir(filepath.Join(env.cfg.Paths.StateDir, "snapshots")); len(ents) != 0 {
		t.Errorf("left in the snapshot dir: %v", ents)
	}
	if res := env.sh(t, sb.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("sandbox after a refused snapshot: %+v", res)
	}
	// A sparse file larger than the disk: refused before it is read
	// (archived in full it would keep the sandbox frozen for minutes).
	if res := env.sh(t, sb.ID, "rm /workspace/r && truncate -s 8G /workspace/sparse"); res.ExitCode != 0 {
		t.Fatal(res.Stderr)
	}
	start := time.Now()
	_, err = env.SnapshotSandbox(ctx, apitypes.SnapshotRequest{SandboxID: sb.ID})
	mustCode(t, "snapshot of a sparse 8G file", err, errdefs.LimitExceeded, "sandbox_id")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refusing the sparse file took %s", d)
	}
}

// TestSnapshotOrphans: what a crash leaves in the snapshot dir — a partial
// write, an archive whose row was never recorded — is removed when the
// engine starts; a recorded archive is not.
func TestSnapshotOrphans(t *testing.T) {
	var dir string
	env := newTestEngine(t, func(c *config.Config) {
		dir = filepath.Join(c.Paths.StateDir, "snapshots")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{".partial-123", strings.Repeat("c", 64) + ".tar.zst"} {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	})
	sb := env.create(t, CreateSandboxRequest{})
	snap, err := env.SnapshotSandbox(context.Background(), apitypes.SnapshotRequest{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) == 1 && ents[0].Name() == snap.ID+".tar.zst" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot dir holds %v, want only %s", ents, snap.ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
