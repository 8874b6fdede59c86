// Package testenv builds the real environments SandboxRunner's integration
// tests run in: the root requirement, the static agent and the daemon
// binaries, the shared content-addressed image cache, private engine
// configurations (own state and run dirs, own cgroup parent), a daemon process
// for black-box tests, and the checks that nothing was left behind.
//
// It is imported only by tests; nothing in it runs in the daemon.
package testenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

// RepoRoot is the repository's top directory.
var RepoRoot = func() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// RequireRoot marks an integration test: it needs root, and `go test -short`
// (make test-unit) skips it. Under SANDBOXD_INTEGRATION=1 (make test) a skip
// would hide a failure, so the test fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	integration := os.Getenv("SANDBOXD_INTEGRATION") == "1"
	switch {
	case os.Geteuid() != 0 && integration:
		t.Fatal("integration test needs root (SANDBOXD_INTEGRATION=1 forbids skipping)")
	case os.Geteuid() != 0:
		t.Skip("integration test needs root")
	case testing.Short() && !integration:
		t.Skip("integration test skipped in -short mode")
	}
}

// SkipOrFail ends a test this host cannot run (the reason formatted): a
// skip normally, a failure under SANDBOXD_INTEGRATION=1, where make test
// must not pass without running it.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("SANDBOXD_INTEGRATION") == "1" {
		t.Fatalf("cannot run here (SANDBOXD_INTEGRATION=1 forbids skipping): "+format, args...)
	}
	t.Skipf(format, args...)
}

// RandHex returns n random bytes in hex.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// BinDir returns a directory holding mcp-sandboxd, sandboxctl and
// sandbox-agent: $SANDBOXD_BIN_DIR (make test builds them) or a build made
// once per test binary, with the Makefile's flags.
func BinDir(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if d := os.Getenv("SANDBOXD_BIN_DIR"); d != "" {
			binDir = d
			return
		}
		// One directory per test process, named by its pid: a test binary
		// cannot tell when the last test using it has ended, so the
		// directories of processes that are gone are removed here instead
		// (each holds about 150 MB of binaries).
		removeDeadBinDirs()
		binDir = filepath.Join(os.TempDir(), fmt.Sprintf("sbx-bin-%d", os.Getpid()))
		if binErr = os.MkdirAll(binDir, 0o700); binErr != nil {
			return
		}
		for _, b := range []struct{ name, cgo, tags string }{
			{"mcp-sandboxd", "1", "seccomp"}, {"sandboxctl", "0", ""}, {"sandbox-agent", "1", "netgo,osusergo"},
			{"sandbox-init", "1", "seccomp"}, // found beside the agent (pkg/runtime/initexec.go)
		} {
			args := []string{"build", "-o", filepath.Join(binDir, b.name)}
			if b.tags != "" {
				args = append(args, "-tags", b.tags)
			}
			cmd := exec.Command("go", append(args, "./cmd/"+b.name)...)
			cmd.Dir = RepoRoot
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("build %s: %v\n%s", b.name, err, out)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

// removeDeadBinDirs removes the BinDir builds of test processes that
// have ended (sbx-bin-PID with no process PID; other names, such as
// those of older harnesses, are left alone).
func removeDeadBinDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-bin-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "sbx-bin-"))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// AgentPath returns the static sandbox-agent: $SANDBOXD_AGENT or the one in BinDir.
func AgentPath(t testing.TB) string {
	if p := os.Getenv("SANDBOXD_AGENT"); p != "" {
		return p
	}
	return filepath.Join(BinDir(t), "sandbox-agent")
}

// ImagesDir is the image cache shared across test runs and packages: images
// are content-addressed, so an unchanged recipe is reused and a changed one
// rebuilt.
func ImagesDir() string {
	if d := os.Getenv("SANDBOXD_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-images"
}

type imageResult struct {
	once sync.Once
	img  *image.Image
	err  error
}

var (
	images sync.Map // recipe name → *imageResult
	// buildSlots lets at most two image builds run at once: each is an
	// mmdebstrap run, and the machine has two cores.
	buildSlots = make(chan struct{}, 2)
)

// EnsureImages builds the named recipes' images into ImagesDir unless they
// are up to date — once per name per test binary, at most two at a time —
// and returns them; it fails t if any cannot be built.
func EnsureImages(t testing.TB, names ...string) map[string]*image.Image {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]*imageResult, len(names))
	for i, name := range names {
		v, _ := images.LoadOrStore(name, &imageResult{})
		res := v.(*imageResult)
		results[i] = res
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.once.Do(func() {
				buildSlots <- struct{}{}
				defer func() { <-buildSlots }()
				res.img, res.err = buildImage(name)
			})
		}()
	}
	wg.Wait()
	out := make(map[string]*image.Image, len(names))
	for i, name := range names {
		if results[i].err != nil {
			t.Fatalf("build image %s: %v", name, results[i].err)
		}
		out[name] = results[i].img
	}
	return out
}

func buildImage(name string) (*image.Image, error) {
	st, err := image.OpenStore(ImagesDir())
	if err != nil {
		return nil, err
	}
	r, err := image.LoadRecipe(filepath.Join(RepoRoot, "rootfs", name+".yaml"))
	if err != nil {
		return nil, err
	}
	b := &image.Builder{Store: st, Suite: config.Default().Images.Suite, Log: io.Discard}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	return b.Ensure(ctx, r)
}

// Config returns the default configuration on private state: a temp state
// dir, a run dir under /run (unix socket paths are limited to 108 bytes), a
// unique cgroup parent, the shared image cache, the repository's recipes and
// seccomp profiles, and the test agent. The run dir and cgroup parent are
// removed when the test ends, after every cleanup registered later.
func Config(t testing.TB, prefix string) *config.Config {
	t.Helper()
	RequireRoot(t)
	runDir, err := os.MkdirTemp("/run", "sbx"+prefix+"-")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.RunDir = runDir
	cfg.Paths.ImagesDir = ImagesDir()
	cfg.Paths.RecipesDir = filepath.Join(RepoRoot, "rootfs")
	cfg.Paths.SeccompDir = filepath.Join(RepoRoot, "seccomp-profiles")
	cfg.Paths.AgentPath = AgentPath(t)
	cfg.Sandbox.CgroupParent = "/mcp-sandboxd-" + prefix + "-" + RandHex(4)
	// Tests leave the host's cgroup2 mount options alone.
	cfg.Sandbox.CgroupFavorDynMods = false
	// A bridge of its own: network gc only touches its own bridge and the
	// veths on it, so a test daemon never disturbs another one's.
	cfg.Network.Bridge = "sbxt" + RandHex(3)
	// A block of the user namespace pool of its own (one of 32): test
	// daemons running at the same time (other packages, other worktrees)
	// then hand out different host ids, so per-uid kernel counts (and the
	// tests asserting them) stay per sandbox across them.
	if u := &cfg.Sandbox.UsernsPool; u.Count > 0 {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		u.Count = 64
		u.Base += int64(b[0]%32) * u.Count * u.Size
	}
	cfg.Sandbox.Memory = 256 << 20
	cfg.Sandbox.Disk = 128 << 20
	// Any free port: test daemons run side by side.
	cfg.Server.PreviewListen = "127.0.0.1:0"
	t.Cleanup(func() {
		// VM cgroups live under the parent's own "vms" child.
		RemoveCgroupParent(t, cfg.Sandbox.CgroupParent+"/vms")
		RemoveCgroupParent(t, cfg.Sandbox.CgroupParent)
		_ = os.RemoveAll(runDir)
	})
	return cfg
}

// Logger logs to t.Log at info level.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// MountsUnder lists the mount points below dir.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

// CgroupDirs lists cgroup path p in every mounted hierarchy where it exists
// (see cgroups.Dirs), on v2, v1 and hybrid hosts alike.
func CgroupDirs(p string) []string {
	return cgroups.Dirs(p)
}

// RemoveCgroupParent removes a test's (by now empty) cgroup parent.
func RemoveCgroupParent(t testing.TB, parent string) {
	for _, d := range CgroupDirs(parent) {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent %s: %v", d, err)
		}
	}
}

// AssertNoLeftovers fails t if any sandbox of cfg left a cgroup, a mount, a
// libcontainer state dir, a sandbox dir, an image file or a loop device
// behind.
func AssertNoLeftovers(t testing.TB, cfg *config.Config) {
	t.Helper()
	for _, dir := range CgroupDirs(cfg.Sandbox.CgroupParent) {
		sbs, _ := filepath.Glob(filepath.Join(dir, "sb-*"))
		vms, _ := filepath.Glob(filepath.Join(dir, "vms", "*"))
		for _, s := range append(sbs, vms...) {
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				t.Errorf("leftover cgroup %s", s)
			}
		}
	}
	for _, m := range MountsUnder(cfg.Paths.RunDir) {
		t.Errorf("leftover mount %s", m)
	}
	// vms: VM state dirs (QEMU's overlay, sockets, vm.json).
	// volumes: a named volume's mount point (a test deletes its volumes).
	for _, sub := range []string{"runtime", "sandboxes", "vms", "volumes"} {
		ents, _ := os.ReadDir(filepath.Join(cfg.Paths.RunDir, sub))
		for _, e := range ents {
			t.Errorf("leftover %s/%s", sub, e.Name())
		}
	}
	images := cfg.Paths.SandboxesDirOrDefault()
	imgs, _ := filepath.Glob(filepath.Join(images, "*.img"))
	for _, img := range imgs {
		t.Errorf("leftover image file %s", img)
	}
	devs, err := storage.LoopDevices()
	if err != nil {
		t.Errorf("list loop devices: %v", err)
	}
	for dev, backing := range devs {
		// Ready disks of the pool (images/pool/) belong to no sandbox.
		if d := filepath.Dir(backing); d == images || d == cfg.Volumes.DirOrDefault(cfg.Paths.StateDir) {
			t.Errorf("leftover loop device %s of %s", dev, backing)
		}
	}
	// Helpers of a daemon of this state dir (marked, pkg/lifetime) die with
	// it: a parent-death signal is delivered as it exits, give it a moment.
	// A daemon still running (it names itself in the lock) is no leftover.
	var marked []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		marked = markedProcesses(cfg.Paths.StateDir)
		if len(marked) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range marked {
		t.Errorf("leftover process of the daemon: %s", p)
	}
}

// markedProcesses lists the live processes, other than the daemon that
// holds the lock, that carry the marker of the daemon of stateDir, as
// "pid (command line)".
func markedProcesses(stateDir string) []string {
	var out []string
	b, _ := os.ReadFile(filepath.Join(stateDir, "lock"))
	daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == daemon || !lifetime.Marked(pid, stateDir) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		out = append(out, fmt.Sprintf("%d (%s)", pid, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
	}
	return out
}
