package mcpserver

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// vmEngine is what the vm_* tools (tools_vm.go) need of the engine: apart,
// so that those tools and their part of Engine go together.
type vmEngine interface {
	CreateVM(ctx context.Context, req apitypes.VMCreateRequest, progress func(string)) (*apitypes.VM, error)
	ListVMs(ctx context.Context, state string) ([]*apitypes.VM, error)
	GetVM(ctx context.Context, id string) (*apitypes.VM, error)
	DestroyVM(ctx context.Context, id string) (*apitypes.VM, error)
	VMExec(ctx context.Context, req apitypes.VMExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error)
	VMWriteFile(ctx context.Context, req apitypes.VMFileWriteRequest) (*apitypes.FileResult, error)
	VMReadFile(ctx context.Context, req apitypes.VMFileReadRequest) (*apitypes.FileReadResult, error)
	SnapshotVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error)
	RestoreVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error)
	ScreenshotVM(ctx context.Context, id string) ([]byte, error)
	VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error)
}
