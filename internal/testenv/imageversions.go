package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FakeImageVersion adds to the image store at dir another version of the
// image stored there under digest from: the same metadata under a made-up
// digest (from seed) with an empty tree. It returns that digest. Tests of
// staleness, pruning and rebuilding use it for "an older (or newer) build"
// of an image without building one.
func FakeImageVersion(t testing.TB, dir, from, seed string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	d := hex.EncodeToString(sum[:])
	data, err := os.ReadFile(filepath.Join(dir, from, "image.json"))
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(data, &meta); err != nil {
		t.Fatal(err)
	}
	meta["digest"] = d
	if data, err = json.Marshal(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, d, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, d, "image.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// SetCurrentImage makes digest the current image of name in the store at
// dir, as a finished build does (by-name/<name> → ../<digest>).
func SetCurrentImage(t testing.TB, dir, name, digest string) {
	t.Helper()
	link := filepath.Join(dir, "by-name", name)
	_ = os.Remove(link)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", digest), link); err != nil {
		t.Fatal(err)
	}
}
