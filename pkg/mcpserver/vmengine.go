package mcpserver

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// vmEngine is what the tools only a machine can serve (tools_vm.go: the
// screen, vm_test) and sandbox_create's boot progress need of the engine:
// apart, so that those tools and their part of Engine go together.
type vmEngine interface {
	CreateSandboxProgress(ctx context.Context, req apitypes.CreateSandboxRequest, progress func(string)) (*apitypes.Sandbox, error)
	ScreenshotSandbox(ctx context.Context, id string) ([]byte, error)
	VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error)
}
