package snapshots

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// noSandboxes stands for a sandbox service that has none: what the
// snapshot service decides from its rows alone runs without containers,
// as any user.
type noSandboxes struct{}

func (noSandboxes) Get(_ context.Context, id string) (*sandbox.Info, error) {
	return nil, errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
}
func (noSandboxes) Frozen(context.Context, string, func(sandbox.WritableDirs) error) error {
	return errdefs.NotFoundf("sandbox_id: none")
}
func (noSandboxes) Replace(context.Context, string, func(sandbox.WritableDirs) error) error {
	return errdefs.NotFoundf("sandbox_id: none")
}
func (noSandboxes) Capabilities(context.Context, string) (sandbox.Capabilities, error) {
	return sandbox.Capabilities{}, errdefs.NotFoundf("sandbox_id: none")
}
func (noSandboxes) SaveMachineSnapshot(context.Context, string, string) error    { return nil }
func (noSandboxes) RestoreMachineSnapshot(context.Context, string, string) error { return nil }
func (noSandboxes) MachineSnapshots(context.Context, string) ([]string, error)   { return nil, nil }

func newService(t *testing.T, cfg config.Snapshots) (*Service, *store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return New(noSandboxes{}, st, cfg, dir, slog.New(slog.NewTextHandler(io.Discard, nil))), st, dir
}

const id1 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestRefusesHostileIDs(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, config.Snapshots{})
	for _, id := range []string{"", "../../etc/passwd", strings.ToUpper(id1), id1 + "0"} {
		if _, err := s.Get(ctx, id); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "snapshot_id:") {
			t.Errorf("get %q: %v, want invalid_argument naming snapshot_id", id, err)
		}
	}
	if _, err := s.Get(ctx, id1); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Errorf("get of a missing snapshot: %v", err)
	}
	if _, err := s.List(ctx, "a/b"); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "sandbox_id:") {
		t.Errorf("list of a malformed sandbox id: %v", err)
	}
	if _, err := s.Snapshot(ctx, apitypes.SnapshotRequest{SandboxID: "sb1", Name: "-x"}); !strings.Contains(err.Error(), "name:") {
		t.Errorf("snapshot named -x: %v", err)
	}
	req := apitypes.CreateSandboxRequest{FromSnapshot: "nope"}
	if _, err := s.ForkSeed(ctx, &req); !strings.Contains(err.Error(), "from_snapshot:") || strings.Contains(err.Error(), "snapshot_id:") {
		t.Errorf("fork from a malformed id: %v, want the error to name from_snapshot", err)
	}
}

func TestRowsSeedDeleteAndJanitor(t *testing.T) {
	ctx := context.Background()
	s, st, dir := newService(t, config.Snapshots{MaxAge: config.Duration(time.Hour)})
	archives := filepath.Join(dir, "snapshots")
	if err := os.MkdirAll(archives, 0o700); err != nil {
		t.Fatal(err)
	}
	created := time.Now().UTC().Truncate(time.Second)
	if err := st.InsertSnapshot(ctx, &store.SnapshotRecord{ID: id1, SandboxID: "sb1", Language: "shell", Image: "shell",
		SizeBytes: 10, ContentBytes: 32 << 20, CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(archives, id1+storage.SnapshotSuffix)
	orphan := filepath.Join(archives, strings.Repeat("f", 64)+storage.SnapshotSuffix)
	for _, f := range []string{archive, orphan} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, id1)
	if err != nil || got.ExpiresAt == nil || !got.ExpiresAt.Equal(created.Add(time.Hour)) || got.Kind != apitypes.SnapshotFiles {
		t.Fatalf("get: %+v, %v: want a files snapshot expiring an hour after it was taken", got, err)
	}
	req := apitypes.CreateSandboxRequest{FromSnapshot: id1}
	rec, err := s.ForkSeed(ctx, &req)
	if err != nil || req.Language != "shell" || req.Image != "shell" {
		t.Fatalf("fork seed: %v, request %+v", err, req)
	}
	spec := &sandbox.Spec{}
	spec.Limits.DiskBytes = 16 << 20
	if err := s.SeedSpec(spec, rec); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "disk_mb:") {
		t.Fatalf("seed into a disk smaller than the files: %v", err)
	}
	spec.Limits.DiskBytes = 64 << 20
	if err := s.SeedSpec(spec, rec); err != nil || spec.Seed != archive || spec.SeedSnapshot != id1 {
		t.Fatalf("seed: %v, spec seed %q %q", err, spec.Seed, spec.SeedSnapshot)
	}
	s.sweepSnapshots(ctx, true) // the janitor's first pass
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphaned archive still there: %v", err)
	}
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("the recorded archive went: %v", err)
	}
	unlock, err := s.Hold(ctx, id1, "from_snapshot")
	if err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- s.Delete(ctx, id1) }()
	select {
	case err := <-deleted:
		t.Fatalf("delete went ahead while the snapshot was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatalf("archive after delete: %v", err)
	}
	if l, err := s.List(ctx, ""); err != nil || len(l) != 0 {
		t.Fatalf("list after delete: %+v, %v", l, err)
	}
	if err := s.Delete(ctx, id1); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("delete twice: %v", err)
	}
}
