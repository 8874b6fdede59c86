package server

import (
	"bytes"
	"context"
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
