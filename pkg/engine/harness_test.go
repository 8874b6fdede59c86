package engine

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init: libcontainer
// re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

var (
	repoRoot = func() string {
		_, file, _, _ := goruntime.Caller(0)
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}()
	agentOnce   sync.Once
	agentBinary string
	agentErr    error
	imageOnce   sync.Once
	imageErr    error
)

// requireRoot skips a test that needs root, unless SANDBOXD_INTEGRATION=1
// (make test), under which a skip would hide a failure.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("SANDBOXD_INTEGRATION") == "1" {
		t.Fatal("integration test needs root (SANDBOXD_INTEGRATION=1 forbids skipping)")
	}
	t.Skip("integration test needs root")
}

// agentPath returns a static sandbox-agent: $SANDBOXD_AGENT (make test builds
// it) or one built once into a temp dir.
func agentPath(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		if p := os.Getenv("SANDBOXD_AGENT"); p != "" {
			agentBinary = p
			return
		}
		dir, err := os.MkdirTemp("", "sbx-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentBinary = filepath.Join(dir, "sandbox-agent")
		cmd := exec.Command("go", "build", "-o", agentBinary, "./cmd/sandbox-agent")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBinary
}

// testImagesDir is shared across test runs: images are content-addressed, so
// an unchanged recipe is reused and a changed one is rebuilt.
func testImagesDir() string {
	if d := os.Getenv("SANDBOXD_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-images"
}

// ensureShellImage builds the shell image once per test binary.
func ensureShellImage(t testing.TB) {
	t.Helper()
	imageOnce.Do(func() {
		st, err := image.OpenStore(testImagesDir())
		if err != nil {
			imageErr = err
			return
		}
		r, err := image.LoadRecipe(filepath.Join(repoRoot, "rootfs", "shell.yaml"))
		if err != nil {
			imageErr = err
			return
		}
		b := &image.Builder{Store: st, Suite: "bookworm", Log: io.Discard}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		_, imageErr = b.Ensure(ctx, r)
	})
	if imageErr != nil {
		t.Fatalf("build shell image: %v", imageErr)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testEnv is an engine on private state: its own state and run dirs, its own
// cgroup parent, the shared image cache.
type testEnv struct {
	*Engine
	cfg *config.Config
}

func newTestEngine(t testing.TB, tweak ...func(*config.Config)) *testEnv {
	t.Helper()
	requireRoot(t)
	ensureShellImage(t)
	cfg := config.Default()
	// Keep the run dir short: unix socket paths are limited to 108 bytes.
	runDir, err := os.MkdirTemp("/run", "sbxt-")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.RunDir = runDir
	cfg.Paths.ImagesDir = testImagesDir()
	cfg.Paths.RecipesDir = filepath.Join(repoRoot, "rootfs")
	cfg.Paths.SeccompDir = filepath.Join(repoRoot, "seccomp-profiles")
	cfg.Paths.AgentPath = agentPath(t)
	cfg.Sandbox.CgroupParent = "/mcp-sandboxd-test-" + randHex(4)
	cfg.Sandbox.Memory = 256 << 20
	cfg.Sandbox.Disk = 128 << 20
	cfg.Log.Level = "debug"
	for _, f := range tweak {
		f(cfg)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e, err := New(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{Engine: e, cfg: cfg}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, id := range e.sandboxes.IDs() {
			if _, err := e.TerminateSandbox(ctx, id); err != nil {
				t.Errorf("cleanup: terminate %s: %v", id, err)
			}
		}
		_ = e.Close()
		env.assertNoLeftovers(t)
		removeCgroupParent(t, cfg.Sandbox.CgroupParent)
		_ = os.RemoveAll(runDir)
	})
	return env
}

// testWriter sends log lines to t.Log, dropping them once the test is over.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// assertNoLeftovers checks that no sandbox of this engine left a cgroup, a
// mount, a libcontainer state dir or a sandbox dir behind.
func (env *testEnv) assertNoLeftovers(t testing.TB) {
	t.Helper()
	for _, id := range env.sandboxes.IDs() {
		t.Errorf("sandbox %s still live", id)
	}
	parent := env.cfg.Sandbox.CgroupParent
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(parent, "/"), "sb-*"))
	unified, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(parent, "/"), "sb-*"))
	for _, m := range append(matches, unified...) {
		t.Errorf("leftover cgroup %s", m)
	}
	for _, m := range mountsUnder(t, env.cfg.Paths.RunDir) {
		t.Errorf("leftover mount %s", m)
	}
	for _, sub := range []string{"runtime", "sandboxes"} {
		ents, _ := os.ReadDir(filepath.Join(env.cfg.Paths.RunDir, sub))
		for _, e := range ents {
			t.Errorf("leftover %s/%s", sub, e.Name())
		}
	}
}

func mountsUnder(t testing.TB, dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

func removeCgroupParent(t testing.TB, parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(parent, "/")))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(parent, "/")))
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent %s: %v", d, err)
		}
	}
}
