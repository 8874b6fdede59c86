package api

import (
	"context"
	"io"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// vmEngine is what the /v1/vms routes (vms.go) need of the engine: apart,
// so that those routes and their part of Engine go together.
type vmEngine interface {
	CreateVM(ctx context.Context, req apitypes.VMCreateRequest, progress func(string)) (*apitypes.VM, error)
	ListVMs(ctx context.Context, state string) ([]*apitypes.VM, error)
	GetVM(ctx context.Context, id string) (*apitypes.VM, error)
	CheckLiveVM(ctx context.Context, id string) error
	DestroyVM(ctx context.Context, id string) (*apitypes.VM, error)
	VMExec(ctx context.Context, req apitypes.VMExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error)
	VMWriteFileFrom(ctx context.Context, id, p, mode string, size int64, body io.Reader) (*apitypes.FileResult, error)
	VMReadFileRaw(ctx context.Context, req apitypes.FileReadRequest) (*agent.FileData, error)
	SnapshotVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error)
	RestoreVM(ctx context.Context, req apitypes.VMSnapshotRequest) (*apitypes.VMSnapshotResult, error)
	ScreenshotVM(ctx context.Context, id string) ([]byte, error)
	VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error)
}
