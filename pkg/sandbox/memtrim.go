package sandbox

import (
	"runtime/debug"
	"sync"
	"time"
)

// After trimAfterChanges sandboxes started or ended, and once none did
// for trimQuiet, the daemon hands the memory it no longer uses back to
// the system.
//
// Why: a sandbox's structures and buffers are garbage once it ends, but
// an idle daemon allocates too little to start a collection, so the heap
// that served a thousand sandboxes stayed resident, and the runtime's
// scavenger returns only what is above the last collection's goal —
// until the forced collection two minutes later. The same holds after a
// burst of creates: each create's garbage (its OCI spec, libcontainer's
// configuration and process, buffers: several times what the sandbox
// keeps) grew the heap, whose goal is then twice a peak the idle
// sandboxes no longer need. One debug.FreeOSMemory (a collection and a
// scavenge: a few milliseconds for the daemon's heap) after a burst of
// creates or terminates leaves resident what the live sandboxes hold. A
// few changes (a lifecycle at a time) never trigger it, nor does a steady
// stream, which is never quiet for trimQuiet.
const (
	trimAfterChanges = 32
	trimQuiet        = 100 * time.Millisecond
)

// memTrim counts started and ended sandboxes and runs the trim after a
// burst.
type memTrim struct {
	mu      sync.Mutex
	changes int
	timer   *time.Timer
	free    func() // debug.FreeOSMemory; a counter in tests
}

// note notes one started or ended sandbox.
func (t *memTrim) note() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.changes++
	if t.changes < trimAfterChanges {
		return
	}
	if t.timer != nil {
		t.timer.Reset(trimQuiet)
		return
	}
	t.timer = time.AfterFunc(trimQuiet, func() {
		t.mu.Lock()
		t.changes, t.timer = 0, nil
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
