package image

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireRoot is testenv.RequireRoot, set by root_test.go: testenv imports
// this package, so only the external test package can import it.
var RequireRoot func(testing.TB)

// requireRoot marks an integration test (see testenv.RequireRoot).
func requireRoot(t *testing.T) {
	t.Helper()
	RequireRoot(t)
}

// testImagesDir is the image store shared by all test runs. Digests make
// sharing safe: a changed recipe or builder gets a new directory.
func testImagesDir() string {
	if d := os.Getenv("SANDBOXD_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-images"
}

// hostSuite is the host's own Debian release, which its mirror serves.
func hostSuite(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VERSION_CODENAME="); ok && v != "" {
			return strings.Trim(v, `"`)
		}
	}
	t.Fatal("no VERSION_CODENAME in /etc/os-release")
	return ""
}

// newTestBuilder returns a builder on store that logs to log and to the
// test's own log.
func newTestBuilder(t *testing.T, store *Store, log io.Writer) *Builder {
	t.Helper()
	return &Builder{Store: store, Suite: hostSuite(t), Log: io.MultiWriter(log, testLogWriter{t})}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// cachedStore opens the shared test image store.
func cachedStore(t *testing.T) *Store {
	t.Helper()
	s, err := OpenStore(testImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ensureCached builds (or finds) the recipe in the shared store and reports
// the build time when there was a build.
func ensureCached(t *testing.T, r *Recipe) *Image {
	t.Helper()
	var log syncBuffer
	start := time.Now()
	img, err := newTestBuilder(t, cachedStore(t), &log).Ensure(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "building digest") {
		t.Logf("built image %s in %s (%d MiB)", r.Name, time.Since(start).Round(time.Second), img.SizeBytes>>20)
	}
	return img
}

// loadShell loads the real shell recipe from the repository.
func loadShell(t *testing.T) *Recipe {
	t.Helper()
	r, err := LoadRecipe(filepath.Join("..", "..", "rootfs", "shell.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// mountsBelow returns the mount points at or below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
