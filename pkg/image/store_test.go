package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// fakeImage stores an image record for name without building anything.
func fakeImage(t *testing.T, s *Store, name, seed string, current bool) string {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	digest := hex.EncodeToString(sum[:])
	dir := filepath.Join(s.dir, digest)
	if err := os.MkdirAll(filepath.Join(dir, rootfsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	img := &Image{Name: name, Digest: digest, BuiltAt: time.Unix(1700000000, 0).UTC(), Env: map[string]string{"K": "V"}}
	if err := writeImage(dir, img); err != nil {
		t.Fatal(err)
	}
	if current {
		if err := s.setCurrent(name, digest); err != nil {
			t.Fatal(err)
		}
	}
	return digest
}

func TestStore(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get("shell")
	if !errors.Is(err, ErrNotFound) || errdefs.CodeOf(err) != errdefs.NotFound {
		t.Fatalf("Get on an empty store: %v", err)
	}
	old := fakeImage(t, s, "shell", "old", true)
	cur := fakeImage(t, s, "shell", "new", true)
	py := fakeImage(t, s, "python", "py", true)

	img, err := s.Get("shell")
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != cur || img.Rootfs != filepath.Join(s.dir, cur, "rootfs") || img.Env["K"] != "V" {
		t.Fatalf("Get(shell) = %+v", img)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "python" || list[1].Name != "shell" {
		t.Fatalf("List = %v", list)
	}
	for _, bad := range []string{"../etc", "", "Shell"} {
		if _, err := s.Get(bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q): %v", bad, err)
		}
	}

	if err := s.Remove("shell"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{old, cur} {
		if _, err := os.Stat(filepath.Join(s.dir, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Remove(shell) left %s: %v", d, err)
		}
	}
	if _, err := s.Get("shell"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	if img, err := s.Get("python"); err != nil || img.Digest != py {
		t.Errorf("Remove(shell) touched python: %v", err)
	}
	if err := s.Remove("shell"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	entries, _ := filepath.Glob(filepath.Join(s.dir, ".trash-*"))
	if len(entries) > 0 {
		t.Errorf("Remove left %v", entries)
	}
}

func TestStoreDanglingLink(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := fakeImage(t, s, "shell", "x", true)
	if err := os.RemoveAll(filepath.Join(s.dir, d)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("shell"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get with a dangling link: %v", err)
	}
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Errorf("List with a dangling link: %v, %v", list, err)
	}
}

func TestStale(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old := fakeImage(t, s, "py", "py-old", false)
	cur := fakeImage(t, s, "py", "py-new", true)
	other := fakeImage(t, s, "go", "go", true)
	stale, err := s.Stale()
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].Digest != old {
		t.Fatalf("Stale = %+v, want only %s", stale, old[:12])
	}
	if err := s.RemoveDigest("py", cur); err == nil {
		t.Fatal("RemoveDigest of the current image succeeded")
	}
	if err := s.RemoveDigest("go", old); err == nil {
		t.Fatal("RemoveDigest under another name succeeded")
	}
	if err := s.RemoveDigest("py", old); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, old)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale tree still there: %v", err)
	}
	for _, d := range []string{cur, other} {
		if _, err := os.Stat(filepath.Join(s.dir, d)); err != nil {
			t.Fatalf("current tree %s gone: %v", d[:12], err)
		}
	}
	if stale, _ := s.Stale(); len(stale) != 0 {
		t.Fatalf("Stale after prune = %+v", stale)
	}
}

// TestLockLeavesNoFile: a lock's file exists only while it is held, and
// the lock still excludes: waiters that opened the file a release
// unlinked start over on a new one instead of sharing the lock.
func TestLockLeavesNoFile(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	path := filepath.Join(s.dir, lockPrefix+"py")
	var holders atomic.Int32
	var overlap atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				unlock, err := s.lock(ctx, "py")
				if err != nil {
					t.Error(err)
					return
				}
				if holders.Add(1) > 1 {
					overlap.Store(true)
				}
				time.Sleep(time.Millisecond)
				holders.Add(-1)
				unlock()
			}
		}()
	}
	wg.Wait()
	if overlap.Load() {
		t.Fatal("two holders of one lock at once")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("lock file left after every holder released it: %v", err)
	}
}

// TestRemoveDebris: what a crash left (a lock file no process holds, a
// half-built and a half-removed tree) goes; a name whose lock is held
// keeps its build in progress.
func TestRemoveDebris(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	debris := []string{lockPrefix + "oci-0123456789ab", buildPrefix + "oci-0123456789ab.42", trashPrefix + "py.7", lockPrefix + "ruby"}
	live := buildPrefix + "go.9"
	for _, n := range append([]string{live}, debris...) {
		p := filepath.Join(s.dir, n)
		if strings.HasPrefix(n, lockPrefix) {
			err = os.WriteFile(p, nil, 0o600)
		} else {
			err = os.MkdirAll(filepath.Join(p, "rootfs/etc"), 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	unlock, err := s.lock(context.Background(), "go")
	if err != nil {
		t.Fatal(err)
	}
	removed, err := s.RemoveDebris()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(debris)
	if !slices.Equal(removed, debris) {
		t.Errorf("removed %q, want %q", removed, debris)
	}
	for _, n := range debris {
		if _, err := os.Lstat(filepath.Join(s.dir, n)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", n, err)
		}
	}
	for _, n := range []string{live, lockPrefix + "go"} {
		if _, err := os.Lstat(filepath.Join(s.dir, n)); err != nil {
			t.Errorf("%s of a held lock removed: %v", n, err)
		}
	}
	unlock()
	if removed, err := s.RemoveDebris(); err != nil || !slices.Equal(removed, []string{live}) {
		t.Errorf("once released: removed %q, %v; want %s", removed, err, live)
	}
}
