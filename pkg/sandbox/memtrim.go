package sandbox

import (
	"runtime/debug"
	"sync"
	"time"
)

// After trimAfterEnds sandboxes ended, and once no other ended for
// trimQuiet, the daemon hands the memory they held back to the system.
//
// Why: a sandbox's structures, buffers and goroutine stacks (~50 KiB of
// the daemon's RSS each) are garbage once it ends, but an idle daemon
// allocates too little to start a collection, so the heap that served
// a thousand sandboxes stayed resident, and the runtime's scavenger
// returns only what is above the last collection's goal — until the
// forced collection two minutes later. One debug.FreeOSMemory (a
// collection and a scavenge: a few milliseconds for the daemon's heap)
// after a burst of terminates brings the RSS back near its start at
// once. A few ends (a lifecycle at a time) never trigger it.
const (
	trimAfterEnds = 64
	trimQuiet     = 100 * time.Millisecond
)

// memTrim counts ended sandboxes and runs the trim after a burst.
type memTrim struct {
	mu    sync.Mutex
	ended int
	timer *time.Timer
	free  func() // debug.FreeOSMemory; a counter in tests
}

// end notes one ended sandbox.
func (t *memTrim) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended++
	if t.ended < trimAfterEnds {
		return
	}
	if t.timer != nil {
		t.timer.Reset(trimQuiet)
		return
	}
	t.timer = time.AfterFunc(trimQuiet, func() {
		t.mu.Lock()
		t.ended, t.timer = 0, nil
		free := t.free
		t.mu.Unlock()
		if free == nil {
			free = debug.FreeOSMemory
		}
		free()
	})
}

// stop cancels a pending trim (Close).
func (t *memTrim) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
}
