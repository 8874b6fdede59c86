package storage

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopySparse: the copy has the template's bytes and its holes.
func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 5 << 20, 40<<20 + 7, 64<<20 - 3} {
		if _, err := f.WriteAt([]byte("data"), off); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if len(a) != len(b) || string(a) != string(b) {
		t.Fatalf("copy differs: %d vs %d bytes", len(a), len(b))
	}
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("copy allocates %d bytes, want it sparse", st.Blocks*512)
	}
	if err := copySparse(src, dst); err == nil {
		t.Error("copy over an existing file succeeded")
	}
}
