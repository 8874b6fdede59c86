package engine

import (
	"slices"
	"testing"
)

// TestLineWriter: a build log written in arbitrary pieces comes out as
// whole, non-empty lines (the progress of a guest image's first build).
func TestLineWriter(t *testing.T) {
	var lines []string
	w := &lineWriter{emit: func(l string) { lines = append(lines, l) }}
	for _, p := range []string{"I: downloading", " packages\nI: extr", "acting\n\n  \nlast without newline"} {
		if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	w.flush()
	if !slices.Equal(lines, []string{"I: downloading packages", "I: extracting", "last without newline"}) {
		t.Errorf("lines: %q", lines)
	}
}
