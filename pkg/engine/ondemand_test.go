package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestImageBuiltOnFirstUse: on an empty image store, two concurrent first
// run_code calls in the same language cause one build, both see its phases
// as output, and both run. With build_on_demand off, the request fails as
// unavailable instead.
func TestImageBuiltOnFirstUse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image")
	}
	env := newTestEngine(t, func(c *config.Config) { c.Paths.ImagesDir = t.TempDir() })
	ctx := context.Background()

	env.cfg.Images.BuildOnDemand = false
	_, err := env.RunCode(ctx, RunCodeRequest{Language: "shell", Code: "echo hi"}, nil)
	if errdefs.CodeOf(err) != errdefs.Unavailable {
		t.Fatalf("run_code of an unbuilt image with build_on_demand off: %v, want unavailable", err)
	}
	env.cfg.Images.BuildOnDemand = true

	var wg sync.WaitGroup
	outs := make([]strings.Builder, 2)
	var mu sync.Mutex
	errs := make([]error, 2)
	stdouts := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := env.RunCode(ctx, RunCodeRequest{Language: "shell", Code: "echo hi"}, func(stream string, data []byte) {
				mu.Lock()
				outs[i].Write(data)
				mu.Unlock()
			})
			errs[i] = err
			if res != nil {
				stdouts[i] = res.Stdout
			}
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || stdouts[i] != "hi\n" {
			t.Fatalf("run %d: %v, stdout %q\noutput:\n%s", i, errs[i], stdouts[i], outs[i].String())
		}
	}
	t.Logf("first caller's build output:\n%s", outs[0].String())
	for i := range 2 {
		if n := strings.Count(outs[i].String(), "image shell: "); n < 3 {
			t.Errorf("caller %d saw %d build phases, want at least 3:\n%s", i, n, outs[i].String())
		}
	}
	if got := counter(t, env, "sandboxd_image_builds_total", map[string]string{"image": "shell", "outcome": "started"}); got != 1 {
		t.Errorf("image builds started: %v, want 1", got)
	}
	if got := counter(t, env, "sandboxd_image_builds_total", map[string]string{"image": "shell", "outcome": "built"}); got != 1 {
		t.Errorf("image builds finished: %v, want 1", got)
	}
}

// counter reads a counter of the engine's registry.
func counter(t *testing.T, env *testEnv, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := env.MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestImageUsers: an image lists the live sandboxes running on it.
func TestImageUsers(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	users := func() []string {
		imgs, err := env.Images()
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range imgs {
			if im.Name == "shell" {
				return im.Users
			}
		}
		t.Fatal("no shell image listed")
		return nil
	}
	if u := users(); len(u) != 1 || u[0] != info.ID {
		t.Fatalf("users of shell with %s live: %v", info.ID, u)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if u := users(); len(u) != 0 {
		t.Fatalf("users of shell after terminate: %v", u)
	}
}

// TestPruneImages: prune removes stale images (an older digest of a
// recipe) except those a live sandbox runs on.
func TestPruneImages(t *testing.T) {
	shared := testenv.EnsureImages(t, "shell")["shell"]
	private := t.TempDir()
	// The shell image's tree, copied into a private store under its digest.
	x := shared.Digest
	if out, err := exec.Command("cp", "-a", filepath.Dir(shared.Rootfs), filepath.Join(private, x)).CombinedOutput(); err != nil {
		t.Fatalf("copy image: %v %s", err, out)
	}
	fabricate := func(seed string) string { return testenv.FakeImageVersion(t, private, x, seed) }
	setCurrent := func(d string) { testenv.SetCurrentImage(t, private, "shell", d) }
	setCurrent(x)
	env := newTestEngine(t, func(c *config.Config) { c.Paths.ImagesDir = private })
	ctx := context.Background()
	info := env.create(t, CreateSandboxRequest{})
	if info.ImageDigest != x {
		t.Fatalf("sandbox on digest %s, want %s", info.ImageDigest, x)
	}
	unused := fabricate("an older shell nobody runs")
	current := fabricate("a newer shell")
	setCurrent(current) // x is now stale, but info runs on it

	removed, err := env.PruneImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].Digest != unused {
		t.Fatalf("prune removed %+v, want only %s", removed, unused[:12])
	}
	if _, err := os.Stat(filepath.Join(private, x)); err != nil {
		t.Fatalf("the tree a live sandbox runs on was removed: %v", err)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if removed, err = env.PruneImages(ctx); err != nil || len(removed) != 1 || removed[0].Digest != x {
		t.Fatalf("prune after terminate: %+v %v, want %s", removed, err, x[:12])
	}
	if _, err := os.Stat(filepath.Join(private, current)); err != nil {
		t.Fatalf("the current image was removed: %v", err)
	}
}
