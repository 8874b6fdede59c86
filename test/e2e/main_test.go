package e2e

import (
	"os"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// The test binary is also a sandbox's container init where it runs an
// engine in-process (BenchmarkRESTLifecycle's engine side); without
// sandbox-init beside the agent, libcontainer re-executes it as the init.
func TestMain(m *testing.M) {
	runtime.MaybeInit()
	os.Exit(m.Run())
}
