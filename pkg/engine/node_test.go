package engine

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDrainPersists: the drain flag written by SetDraining is what a
// restarted engine reads (compose.go), and ending the drain removes it;
// a state directory that cannot be written refuses the drain.
func TestDrainPersists(t *testing.T) {
	dir := t.TempDir()
	if readDrain(dir) {
		t.Fatal("a fresh state directory reads as draining")
	}
	if err := writeDrain(dir, true); err != nil {
		t.Fatal(err)
	}
	if !readDrain(dir) {
		t.Fatal("a drain did not persist")
	}
	if err := writeDrain(dir, true); err != nil {
		t.Fatalf("a second drain: %v", err)
	}
	if err := writeDrain(dir, false); err != nil {
		t.Fatal(err)
	}
	if readDrain(dir) {
		t.Fatal("an ended drain still reads as draining")
	}
	if err := writeDrain(dir, false); err != nil {
		t.Fatalf("ending a drain twice: %v", err)
	}
	if err := writeDrain(filepath.Join(dir, "missing"), true); err == nil || !os.IsNotExist(err) {
		t.Fatalf("a drain in a missing directory: %v", err)
	}
}
