package server

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// An agent returns its heap to the kernel once requests stop, but only
// after requests that allocated at least trimMinAlloc: a ping does not
// make it collect, writing and reading back a 2 MiB file does, about
// idleTrimDelay after the last request.
func TestIdleTrimAfterLargeRequestsOnly(t *testing.T) {
	srv, c := newPipeServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	start := srv.trimmedAt.Load()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A ping allocates far less than trimMinAlloc: no trim is armed.
	if srv.trim.Stop() {
		t.Fatal("a ping armed the idle trim")
	}

	content := bytes.Repeat([]byte("trim me "), 256<<10) // 2 MiB
	if _, err := c.WriteFile(ctx, agent.WriteFileRequest{Path: "/big", Mode: 0o644, Size: int64(len(content))}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if d, err := c.ReadFile(ctx, "/big", 0, 4<<20); err != nil || len(d.Data) != len(content) {
		t.Fatalf("read back: %v", err)
	}
	armed := time.Now()
	for srv.trimmedAt.Load() == start {
		if time.Since(armed) > idleTrimDelay+10*time.Second {
			t.Fatalf("no trim %s after requests that allocated %d bytes", time.Since(armed), heapAllocated()-start)
		}
		time.Sleep(20 * time.Millisecond) // polling the timer's effect
	}
	if waited := time.Since(armed); waited < idleTrimDelay/2 {
		t.Errorf("trimmed %s after the last request, want about %s", waited, idleTrimDelay)
	}
}

// A job the daemon ran with HoldOutput and then forgot is garbage at once:
// the hold's HoldGrace timer, stopped when the attach comes, must not keep
// the job and its output reachable for 30 s — the idle trim would return
// nothing of it, and an idle sandbox would keep every recent command's
// output in its heap (3.1 MiB after 20 commands of 100 KiB each).
func TestForgottenHeldJobIsCollected(t *testing.T) {
	srv, c := newPipeServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	collected := make(chan struct{})
	var out int
	exit, err := c.Run(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "seq 1 3000"}, HoldOutput: true},
		func(id string) {
			j, err := srv.jobs.get(id)
			if err != nil {
				t.Errorf("started job %s: %v", id, err)
				return
			}
			runtime.AddCleanup(j, func(ch chan struct{}) { close(ch) }, collected)
		},
		func(ch agent.Chunk) error { out += len(ch.Data); return nil })
	if err != nil || exit.ExitCode != 0 || out != 13893 {
		t.Fatalf("run: %v %+v, %d bytes of output", err, exit, out)
	}
	if n, _ := srv.jobs.counts(); n != 0 {
		t.Fatalf("%d jobs kept after a followed run", n)
	}
	// Well within HoldGrace: only a collection that finds the job
	// unreachable runs its cleanup.
	deadline := time.Now().Add(agent.HoldGrace / 3)
	for {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(50 * time.Millisecond): // the cleanup runs on its own goroutine
		}
		if time.Now().After(deadline) {
			t.Fatalf("a forgotten held job is still reachable %s after its run", agent.HoldGrace/3)
		}
	}
}
