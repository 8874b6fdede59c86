package audit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store/pgstore"
)

// sqliteCheckpoints adapts the daemon's state database as the engine does.
type sqliteCheckpoints struct{ s *store.Store }

func (a sqliteCheckpoints) SaveAuditCheckpoint(ctx context.Context, c audit.Checkpoint) error {
	return a.s.SaveAuditCheckpoint(ctx, store.AuditCheckpoint(c))
}

func (a sqliteCheckpoints) AuditCheckpoints(ctx context.Context) ([]audit.Checkpoint, error) {
	cs, err := a.s.AuditCheckpoints(ctx)
	out := make([]audit.Checkpoint, len(cs))
	for i, c := range cs {
		out[i] = audit.Checkpoint(c)
	}
	return out, err
}

func (a sqliteCheckpoints) DeleteAuditCheckpointsBefore(ctx context.Context, seq uint64) error {
	return a.s.DeleteAuditCheckpointsBefore(ctx, seq)
}

// checkpointDrivers are the stores that keep checkpoints: the same
// rotation, retention and tampering scenario runs on each.
var checkpointDrivers = []struct {
	name string
	open func(t *testing.T) audit.Checkpoints
}{
	{"sqlite", func(t *testing.T) audit.Checkpoints {
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return sqliteCheckpoints{st}
	}},
	{"postgres", func(t *testing.T) audit.Checkpoints {
		st, err := pgstore.Open(context.Background(), testenv.Postgres(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}},
}

// TestCheckpointDrivers: files rotate, retention drops the oldest with
// their checkpoints in the store, the log verifies against the store, and
// a file removed by hand (its checkpoints still in the store) is found.
func TestCheckpointDrivers(t *testing.T) {
	for _, d := range checkpointDrivers {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			cps := d.open(t)
			dir := t.TempDir()
			l, err := audit.Open(audit.Options{Dir: dir, MaxFileBytes: 4 << 10, MaxTotalBytes: 16 << 10, CheckpointEvery: 5, Checkpoints: cps, Log: testenv.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for i := range 200 {
				if err := l.Append(audit.Record{KeyName: "k", FrontEnd: "rest", Action: "POST /v1/sandboxes", Target: fmt.Sprint(i), Outcome: audit.Success}); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := l.Verify(ctx)
			if err != nil || !rep.OK || rep.LastSeq != 200 || rep.FirstSeq == 1 || rep.Checkpoints == 0 {
				t.Fatalf("rotated log: %+v %v", rep, err)
			}
			stored, err := cps.AuditCheckpoints(ctx)
			if err != nil || len(stored) == 0 || stored[0].Seq < rep.FirstSeq {
				t.Fatalf("checkpoints after retention: %v %v (log begins at %d)", stored, err, rep.FirstSeq)
			}
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			sort.Strings(names)
			if err := os.Remove(filepath.Join(dir, names[0])); err != nil {
				t.Fatal(err)
			}
			rep, err = l.Verify(ctx)
			if err != nil || rep.OK || rep.Problem == nil || rep.Problem.Kind != audit.Removed {
				t.Fatalf("file removed by hand: %+v %v", rep, err)
			}
		})
	}
}
