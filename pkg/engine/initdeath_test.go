package engine

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestInitDeathNoticed kills the init (the agent) of a sandbox the engine
// started, and of one it adopted after a restart: each must be terminated
// at once with its init's end as the reason. Their inits' exits are watched
// by one goroutine for all (pkg/fdwatch), not by one per sandbox.
func TestInitDeathNoticed(t *testing.T) {
	requireRoot(t)
	testenv.EnsureImages(t, "shell")
	cfg := testenv.Config(t, "initd")
	ctx := context.Background()
	e1, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	env := watchEngine(t, e1, cfg)
	started, err := e1.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	adopted, err := e1.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}

	killInit := func(e *Engine, id, want string) {
		t.Helper()
		h, _, err := e.sandboxes.Handle(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		pid := h.Identity().PID
		if pid <= 0 {
			t.Fatalf("sandbox %s: init pid %d", id, pid)
		}
		t0 := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Bounded wait: the exit is seen as the kernel reports it and the
		// terminate takes milliseconds; 5 s is only a ceiling for a loaded host.
		for {
			d, err := e.GetSandbox(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if d.State == apitypes.StateTerminated {
				if !strings.HasPrefix(d.Reason, want) {
					t.Errorf("sandbox %s terminated with reason %q, want %q…", id, d.Reason, want)
				}
				t.Logf("sandbox %s: init death noticed and terminated in %v", id, time.Since(t0))
				break
			}
			if time.Since(t0) > 5*time.Second {
				t.Fatalf("sandbox %s still %s 5 s after its init was killed", id, d.State)
			}
			time.Sleep(5 * time.Millisecond) // a sampling interval, not synchronisation
		}
		select {
		case <-h.Done():
		default:
			t.Errorf("sandbox %s terminated but its handle's Done is open", id)
		}
	}
	// Our child: reaped, its exit status in the reason.
	killInit(e1, started.ID, "sandbox init exited (signal: killed)")
	if res := env.sh(t, adopted.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Fatalf("the other sandbox after one's init died: %+v", res)
	}

	// Restart: the second sandbox is adopted (not our child any more:
	// watched through its pidfd only, no exit status).
	e1.sandboxes.Close()
	if err := e1.Close(); err != nil {
		t.Fatal(err)
	}
	e2, err := New(ctx, cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	env.Engine = e2
	if res := env.sh(t, adopted.ID, "echo alive"); res.Stdout != "alive\n" {
		t.Fatalf("adopted sandbox: %+v", res)
	}
	killInit(e2, adopted.ID, "sandbox init exited")
}
