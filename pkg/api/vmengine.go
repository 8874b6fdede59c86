package api

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// vmEngine is what the routes only a machine can serve (vms.go: a create
// with boot progress, the screen, vm_test) need of the engine: apart, so
// that those routes and their part of Engine go together.
type vmEngine interface {
	CreateSandboxProgress(ctx context.Context, req apitypes.CreateSandboxRequest, progress func(string)) (*apitypes.Sandbox, error)
	ScreenshotSandbox(ctx context.Context, id string) ([]byte, error)
	VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error)
}
