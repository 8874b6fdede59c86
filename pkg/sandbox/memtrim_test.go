package sandbox

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestMemTrimAfterBurst: fewer than trimAfterChanges starts or ends never
// trim; a burst trims once, after the changes stop for trimQuiet, and
// counting starts over.
func TestMemTrimAfterBurst(t *testing.T) {
	var freed atomic.Int32
	tr := &memTrim{free: func() { freed.Add(1) }}
	for range trimAfterChanges - 1 {
		tr.note()
	}
	time.Sleep(3 * trimQuiet) // a window in which a trim would have run, not synchronisation
	if n := freed.Load(); n != 0 {
		t.Fatalf("%d trims after %d changes, want none", n, trimAfterChanges-1)
	}
	for range 3 * trimAfterChanges {
		tr.note() // one burst: the quiet period restarts with each change
	}
	deadline := time.Now().Add(5 * time.Second)
	for freed.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * trimQuiet) // a second trim, if any, would run in this window
	if n := freed.Load(); n != 1 {
		t.Fatalf("%d trims after one burst, want 1", n)
	}
	tr.mu.Lock()
	changes, pending := tr.changes, tr.timer != nil
	tr.mu.Unlock()
	if changes != 0 || pending {
		t.Fatalf("after the trim: %d changes counted, timer pending %v; want 0, false", changes, pending)
	}
	tr.stop()
}
