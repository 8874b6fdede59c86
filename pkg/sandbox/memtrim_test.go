package sandbox

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestMemTrimAfterBurst: fewer than trimAfterEnds ends never trim; a burst
// trims once, after the ends stop for trimQuiet, and counting starts over.
func TestMemTrimAfterBurst(t *testing.T) {
	var freed atomic.Int32
	tr := &memTrim{free: func() { freed.Add(1) }}
	for range trimAfterEnds - 1 {
		tr.end()
	}
	time.Sleep(3 * trimQuiet) // a window in which a trim would have run, not synchronisation
	if n := freed.Load(); n != 0 {
		t.Fatalf("%d trims after %d ends, want none", n, trimAfterEnds-1)
	}
	for range 3 * trimAfterEnds {
		tr.end() // one burst: the quiet period restarts with each end
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
	ended, pending := tr.ended, tr.timer != nil
	tr.mu.Unlock()
	if ended != 0 || pending {
		t.Fatalf("after the trim: %d ends counted, timer pending %v; want 0, false", ended, pending)
	}
	tr.stop()
}
