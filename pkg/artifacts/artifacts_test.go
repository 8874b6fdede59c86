package artifacts

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestCommitOpenAbortPrune(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "artifacts"))
	w, err := s.Create("sb-1", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("archive bytes")); err != nil {
		t.Fatal(err)
	}
	art, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("archive bytes"))
	if art.Size != 13 || art.SHA256 != hex.EncodeToString(sum[:]) || !ValidID(art.ID) {
		t.Fatalf("artifact = %+v", art)
	}
	w.Abort() // no-op after Commit
	got, rc, err := s.Open(art.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "archive bytes" || got.SandboxID != "sb-1" || got.Path != "/workspace" {
		t.Fatalf("open = %+v %q", got, b)
	}

	w2, err := s.Create("sb-1", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	w2.Abort()
	if _, _, err := s.Open(w2.art.ID); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("aborted artifact: %v", err)
	}
	if _, err := os.Stat(s.path(w2.art.ID, ".tar.gz")); !os.IsNotExist(err) {
		t.Fatalf("aborted archive left on disk: %v", err)
	}
	if _, _, err := s.Open("../../etc/passwd"); errdefs.CodeOf(err) != errdefs.InvalidArgument {
		t.Fatalf("malformed id: %v", err)
	}

	old := time.Now().Add(-2 * time.Hour)
	for _, ext := range []string{".tar.gz", ".json"} {
		if err := os.Chtimes(s.path(art.ID, ext), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Prune(time.Hour); n != 2 {
		t.Fatalf("pruned %d files, want 2", n)
	}
	if _, _, err := s.Open(art.ID); errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("pruned artifact: %v", err)
	}
}
