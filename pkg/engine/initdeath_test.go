package engine

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
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

	// Our child: reaped, its exit status in the reason.
	killInit(t, e1, started.ID, "sandbox init exited (signal: killed)")
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
	killInit(t, e2, adopted.ID, "sandbox init exited")
}

// killInit kills sandbox id's init and waits (bounded) until e has
// terminated it with a reason that starts with want.
func killInit(t *testing.T, e *Engine, id, want string) {
	t.Helper()
	ctx := context.Background()
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

// TestInitDeathNoticedWhileSeccompFlooded: a sandbox whose processes make
// refused syscalls (seccomp notifications, answered by the same watcher
// goroutine that sees every init's exit) as fast as they are answered
// does not delay another sandbox's init death being noticed.
func TestInitDeathNoticedWhileSeccompFlooded(t *testing.T) {
	requireRoot(t)
	unshareNr := map[string]int{"amd64": 272, "arm64": 97}[goruntime.GOARCH]
	if unshareNr == 0 {
		t.Fatalf("no unshare(2) number for %s in this test", goruntime.GOARCH)
	}
	env := newTestEngine(t)
	ctx := context.Background()
	flood, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	// Four processes calling unshare(CLONE_NEWUSER), refused through the
	// notify rule, in a loop for 3 s (perl-base is in every Debian image).
	spin := fmt.Sprintf("timeout 3 perl -e 'syscall(%d, 0x10000000) while 1'", unshareNr)
	type result struct {
		res *sandbox.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := env.Exec(ctx, ExecRequest{SandboxID: flood.ID, Command: strings.Repeat(spin+" & ", 4) + "wait"}, nil)
		done <- result{res, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); len(hostProcsOf(t, flood.ID, "perl")) < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("the flooding processes did not start: %v", hostProcsOf(t, flood.ID, "perl"))
		}
		time.Sleep(10 * time.Millisecond) // a sampling interval, not synchronisation
	}
	killInit(t, env.Engine, victim.ID, "sandbox init exited (signal: killed)")
	if len(hostProcsOf(t, flood.ID, "perl")) < 4 {
		t.Fatal("the flood ended before the other sandbox's init death was noticed: the test proves nothing")
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the flooding command did not end within 30 s")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	var refused uint64
	for _, b := range r.res.BlockedSyscalls {
		if b.Name == "unshare" {
			refused = b.Count
		}
	}
	// Each refusal is a notification the watcher answered: the flood was one.
	t.Logf("unshare refused %d times in the flood", refused)
	if refused < 1000 {
		t.Errorf("unshare refused %d times in 3 s by 4 processes, want a flood (≥ 1000); blocked: %+v", refused, r.res.BlockedSyscalls)
	}
}
