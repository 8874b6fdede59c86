package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// SeedImages makes a private image store holding the shared cache's
// images names (built first if needed), as hard links of their trees
// (read-only to everything that uses them), so that a test that adds to
// its store (builds, layers, the build cache) leaves the shared cache as
// it was. The store is removed with the test.
func SeedImages(t testing.TB, names ...string) string {
	t.Helper()
	imgs := EnsureImages(t, names...)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "by-name"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		digest := imgs[n].Digest
		if out, err := exec.Command("cp", "-al", filepath.Join(ImagesDir(), digest), filepath.Join(dir, digest)).CombinedOutput(); err != nil {
			t.Fatalf("seed image %s: %v: %s", n, err, out)
		}
		if err := os.Symlink("../"+digest, filepath.Join(dir, "by-name", n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
