package pipeline

import (
	"strings"
	"testing"
)

// TestTextDiff: equal logs have no diff; changed text is a unified diff
// labelled original/ and replay/; a log that is not text is described by
// its sizes and SHA-256s.
func TestTextDiff(t *testing.T) {
	if d := textDiff("stdout", []byte("a\nb\n"), []byte("a\nb\n")); d != "" {
		t.Errorf("equal logs: %q", d)
	}
	want := "--- original/stdout\n+++ replay/stdout\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
	if d := textDiff("stdout", []byte("a\nb\n"), []byte("a\nc\n")); d != want {
		t.Errorf("changed log:\n%s\nwant\n%s", d, want)
	}
	d := textDiff("stderr", []byte("x\x00y"), []byte("x"))
	if !strings.HasPrefix(d, "--- original/stderr (3 bytes, sha256 ") || !strings.Contains(d, "\n+++ replay/stderr (1 bytes, sha256 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881)\n") {
		t.Errorf("binary log: %q", d)
	}
	big := []byte(strings.Repeat("line\n", maxDiffText/5+1))
	if d := textDiff("stdout", big, []byte("line\n")); strings.Contains(d, "@@") {
		t.Errorf("a log over %d bytes was diffed by line", maxDiffText)
	}
}

// TestFileDiffs: output files equal on both sides are left out; the rest
// are added, removed or changed, in path order, text as unified diffs and
// binary by size and hash.
func TestFileDiffs(t *testing.T) {
	orig := map[string][]byte{"same.txt": []byte("s\n"), "gone.txt": []byte("g\n"), "t.txt": []byte("1\n"), "b.bin": {0, 1}}
	replay := map[string][]byte{"same.txt": []byte("s\n"), "new.txt": []byte("n\n"), "t.txt": []byte("2\n"), "b.bin": {0, 2, 3}}
	got := fileDiffs(orig, replay)
	if len(got) != 4 {
		t.Fatalf("got %d diffs: %+v", len(got), got)
	}
	b, gone, n, tx := got[0], got[1], got[2], got[3]
	if b.Path != "b.bin" || !b.Binary || b.Change != "changed" || b.Diff != "" || *b.OriginalSize != 2 || *b.ReplaySize != 3 || b.OriginalSHA256 == b.ReplaySHA256 || len(b.ReplaySHA256) != 64 {
		t.Errorf("binary: %+v", b)
	}
	if gone.Path != "gone.txt" || gone.Change != "removed" || gone.ReplaySize != nil || gone.Diff != "--- original/output/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-g\n" {
		t.Errorf("removed: %+v", gone)
	}
	if n.Path != "new.txt" || n.Change != "added" || n.OriginalSize != nil || n.Diff != "--- /dev/null\n+++ replay/output/new.txt\n@@ -0,0 +1 @@\n+n\n" {
		t.Errorf("added: %+v", n)
	}
	if tx.Path != "t.txt" || tx.Change != "changed" || tx.Binary || tx.Diff != "--- original/output/t.txt\n+++ replay/output/t.txt\n@@ -1 +1 @@\n-1\n+2\n" {
		t.Errorf("changed: %+v", tx)
	}
	if d := fileDiffs(orig, orig); len(d) != 0 {
		t.Errorf("same files: %+v", d)
	}
}
