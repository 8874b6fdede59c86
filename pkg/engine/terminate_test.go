package engine

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestTerminateWithFailingStateWrite: when the database refuses the
// terminated state (a real SQLite failure: a trigger aborting the update),
// terminate fails and leaves the sandbox exactly as its record says — ready
// and working — rather than a ready record with nothing behind it; once
// the database accepts writes again, terminate completes.
func TestTerminateWithFailingStateWrite(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})

	db, err := sql.Open("sqlite", "file:"+filepath.Join(env.cfg.Paths.StateDir, "state.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TRIGGER refuse_terminated BEFORE UPDATE OF state ON sandboxes
WHEN NEW.state = 'terminated' BEGIN SELECT RAISE(ABORT, 'injected: the state write fails'); END`); err != nil {
		t.Fatal(err)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err == nil || errdefs.CodeOf(err) != errdefs.Internal {
		t.Fatalf("terminate with a failing state write: %v, want an internal error", err)
	}
	got, err := env.GetSandbox(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != apitypes.StateReady {
		t.Errorf("record after the failed terminate: %s", got.State)
	}
	// What the record says is true: the sandbox still runs commands.
	if res := env.sh(t, info.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("the sandbox after the failed terminate: %q %q", res.Stdout, res.Stderr)
	}

	if _, err := db.Exec(`DROP TRIGGER refuse_terminated`); err != nil {
		t.Fatal(err)
	}
	done, err := env.TerminateSandbox(ctx, info.ID)
	if err != nil || done.State != apitypes.StateTerminated {
		t.Fatalf("terminate once the database accepts writes: %+v %v", done, err)
	}
	if _, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("exec after terminate: %v, want conflict", err)
	}
}
