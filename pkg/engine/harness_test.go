package engine

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also every sandbox's container init: libcontainer
// re-executes it with "init".
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}

var (
	requireRoot = testenv.RequireRoot
	randHex     = testenv.RandHex
	mountsUnder = testenv.MountsUnder
)

// testEnv is an engine on private state (testenv.Config): its own state and
// run dirs, its own cgroup parent, the shared image cache.
type testEnv struct {
	*Engine
	cfg *config.Config
}

// liveIDs lists the live sandboxes once the ephemeral runs that answered
// have released theirs (run_code terminates its sandbox after answering:
// pipeline.FinishAndRelease).
func (e *testEnv) liveIDs(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.pipeline.WaitReleases(ctx)
	if ctx.Err() != nil {
		t.Fatal("ephemeral runs' sandboxes still being released after a minute")
	}
	return e.sandboxes.IDs()
}

func newTestEngine(t testing.TB, tweak ...func(*config.Config)) *testEnv {
	t.Helper()
	cfg := testenv.Config(t, "test")
	testenv.EnsureImages(t, "shell")
	for _, f := range tweak {
		f(cfg)
	}
	e, err := New(context.Background(), cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return watchEngine(t, e, cfg)
}

// watchEngine wraps an engine on cfg (a new one, or one re-created on the
// state of an earlier one, as after a daemon restart) and registers the
// cleanup that terminates its sandboxes, closes it and checks that nothing
// was left behind.
func watchEngine(t testing.TB, e *Engine, cfg *config.Config) *testEnv {
	t.Helper()
	env := &testEnv{Engine: e, cfg: cfg}
	t.Cleanup(func() {
		ctx := context.Background()
		// A test that restarts the engine on the same state replaces
		// env.Engine with the new one, which owns the sandboxes then.
		e := env.Engine
		e.sandboxes.Close() // no reaping or pool refills while we clean up
		for _, id := range e.sandboxes.IDs() {
			if _, err := e.TerminateSandbox(ctx, id); err != nil {
				t.Errorf("cleanup: terminate %s: %v", id, err)
			}
		}
		_ = e.Close()
		env.assertNoLeftovers(t)
	})
	return env
}

// assertNoLeftovers checks that no sandbox of this engine is live or left a
// cgroup, a mount, a libcontainer state dir or a sandbox dir behind.
func (env *testEnv) assertNoLeftovers(t testing.TB) {
	t.Helper()
	for _, id := range env.sandboxes.IDs() {
		t.Errorf("sandbox %s still live", id)
	}
	testenv.AssertNoLeftovers(t, env.cfg)
}
