package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// TestPauseResume: a paused sandbox's busy loop uses no CPU (the cgroup's
// usage is flat over 2 s), commands are refused with conflict, resume lets
// the loop continue, and a paused sandbox can be terminated.
func TestPauseResume(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	if _, err := env.StartJob(ctx, ExecRequest{SandboxID: info.ID, Command: "while :; do :; done"}); err != nil {
		t.Fatal(err)
	}
	cpu := func() float64 {
		t.Helper()
		d, err := env.GetSandbox(ctx, info.ID)
		if err != nil || d.Usage == nil {
			t.Fatalf("get %s: %v %+v", info.ID, err, d)
		}
		return d.Usage.CPUSeconds
	}
	time.Sleep(300 * time.Millisecond)
	p, err := env.PauseSandbox(ctx, info.ID)
	if err != nil || p.State != sandbox.StatePaused {
		t.Fatalf("pause: %v %+v", err, p)
	}
	before := cpu()
	time.Sleep(2 * time.Second)
	if used := cpu() - before; used > 0.02 {
		t.Errorf("paused sandbox used %.3f CPU-seconds in 2s", used)
	}
	if _, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: "true"}, nil); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Errorf("exec on a paused sandbox: %v, want conflict", err)
	}
	if again, err := env.PauseSandbox(ctx, info.ID); err != nil || again.State != sandbox.StatePaused {
		t.Errorf("second pause: %v %+v", err, again)
	}

	r, err := env.ResumeSandbox(ctx, info.ID)
	if err != nil || r.State != sandbox.StateRunning {
		t.Fatalf("resume with the loop in flight: %v %+v, want running", err, r)
	}
	before = cpu()
	time.Sleep(time.Second)
	if used := cpu() - before; used < 0.05 { // low: the test host may be heavily loaded
		t.Errorf("resumed busy loop used only %.3f CPU-seconds in 1s", used)
	}

	// Idle sandboxes pause and resume to ready; a paused one terminates
	// (the freezer is thawed so that SIGKILL is delivered).
	idle := env.create(t, CreateSandboxRequest{})
	if _, err := env.PauseSandbox(ctx, idle.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := env.ResumeSandbox(ctx, idle.ID); err != nil || r.State != sandbox.StateReady {
		t.Fatalf("resume idle: %v %+v, want ready", err, r)
	}
	if _, err := env.PauseSandbox(ctx, idle.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := env.TerminateSandbox(ctx, idle.ID); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("terminating a paused sandbox hangs")
	}
	if _, err := env.ResumeSandbox(ctx, idle.ID); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Errorf("resume of a terminated sandbox: %v, want conflict", err)
	}
}
