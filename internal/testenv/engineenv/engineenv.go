// Package engineenv extends internal/testenv for tests that run an engine
// in their own process (the REST and MCP front ends' tests, the REST
// benchmark's engine side). It is separate from testenv because it imports
// pkg/engine, whose own tests import testenv.
package engineenv

import (
	"context"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// New starts an engine on cfg (testenv.Config's, as the caller tweaked it)
// and registers the cleanup that terminates every sandbox still live,
// closes the engine and checks that nothing was left on the host. The
// caller ensures the images it needs.
func New(t testing.TB, cfg *config.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(context.Background(), cfg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		live, err := e.ListSandboxes(ctx, "")
		if err != nil {
			t.Errorf("cleanup: list sandboxes: %v", err)
		}
		for _, sb := range live {
			if _, err := e.TerminateSandbox(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", sb.ID, err)
			}
		}
		_ = e.Close()
		testenv.AssertNoLeftovers(t, cfg)
	})
	return e
}
