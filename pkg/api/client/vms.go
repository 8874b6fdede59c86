package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// VM types of the contract (pkg/apitypes).
type (
	VM                = apitypes.VM
	VMCreateRequest   = apitypes.VMCreateRequest
	VMSnapshotRequest = apitypes.VMSnapshotRequest
	VMSnapshotResult  = apitypes.VMSnapshotResult
	VMTestRequest     = apitypes.VMTestRequest
	VMTestResult      = apitypes.VMTestResult
)

func vmPath(id, rest string) string { return "/v1/vms/" + url.PathEscape(id) + rest }

// VMCreateLine is one line of the vm create stream (POST
// /v1/vms?stream=true): a progress line, the VM, or the error that ended
// the create.
type VMCreateLine struct {
	Log   string     `json:"log,omitempty"`
	VM    *VM        `json:"vm,omitempty"`
	Error *ErrorBody `json:"error,omitempty"`
}

// CreateVM starts a VM (POST /v1/vms). onLog, if not nil, sees the
// progress lines of a slow start (a guest image built on its first use, a
// disk guest booting) as they come.
func (c *Client) CreateVM(ctx context.Context, req VMCreateRequest, onLog func(string)) (*VM, error) {
	if onLog == nil {
		var v VM
		return &v, c.doJSON(ctx, http.MethodPost, "/v1/vms", nil, req, &v, http.StatusCreated)
	}
	return postStream(ctx, c, "/v1/vms", url.Values{"stream": {"true"}}, req, "vm create", func(line *VMCreateLine) (bool, *VM, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.VM != nil:
			return true, line.VM, nil
		case line.Log != "":
			onLog(line.Log)
		}
		return false, nil, nil
	})
}

// ListVMs lists VMs in state ("" for the live ones, "all").
func (c *Client) ListVMs(ctx context.Context, state string) ([]*VM, error) {
	var q url.Values
	if state != "" {
		q = url.Values{"state": {state}}
	}
	var l struct {
		VMs []*VM `json:"vms"`
	}
	return l.VMs, c.doJSON(ctx, http.MethodGet, "/v1/vms", q, nil, &l)
}

// GetVM describes a VM with its snapshots.
func (c *Client) GetVM(ctx context.Context, id string) (*VM, error) {
	var v VM
	return &v, c.doJSON(ctx, http.MethodGet, vmPath(id, ""), nil, nil, &v)
}

// DestroyVM stops and deletes a VM.
func (c *Client) DestroyVM(ctx context.Context, id string) (*VM, error) {
	var v VM
	return &v, c.doJSON(ctx, http.MethodDelete, vmPath(id, ""), nil, nil, &v)
}

// VMExec runs a command in a VM (the request's SandboxID is ignored).
func (c *Client) VMExec(ctx context.Context, id string, req ExecRequest, onOutput OutputFunc) (*ExecResult, error) {
	req.SandboxID = ""
	return c.execAt(ctx, vmPath(id, ""), req, onOutput)
}

// VMWriteFile uploads size bytes from r to path in a VM.
func (c *Client) VMWriteFile(ctx context.Context, id, path string, mode uint32, size int64, r io.Reader) (*FileResult, error) {
	return c.writeFileAt(ctx, vmPath(id, ""), path, mode, false, size, r)
}

// VMReadFile copies up to max bytes of path in a VM to w.
func (c *Client) VMReadFile(ctx context.Context, id, path string, offset, max int64, w io.Writer) (*FileData, error) {
	return c.readFileAt(ctx, vmPath(id, ""), path, offset, max, w)
}

// SnapshotVM saves a VM's state under name.
func (c *Client) SnapshotVM(ctx context.Context, id, name string) (*VMSnapshotResult, error) {
	var r VMSnapshotResult
	return &r, c.doJSON(ctx, http.MethodPost, vmPath(id, "/snapshots"), nil, VMSnapshotRequest{Name: name}, &r, http.StatusCreated)
}

// RestoreVM returns a VM to snapshot name.
func (c *Client) RestoreVM(ctx context.Context, id, name string) (*VMSnapshotResult, error) {
	var r VMSnapshotResult
	return &r, c.doJSON(ctx, http.MethodPost, vmPath(id, "/restore"), nil, VMSnapshotRequest{Name: name}, &r)
}

// ScreenshotVM returns a VM's screen as PNG.
func (c *Client) ScreenshotVM(ctx context.Context, id string) ([]byte, error) {
	resp, err := c.send(ctx, http.MethodGet, vmPath(id, "/screenshot"), nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, resp.Body); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// VMTest runs a vm_test (POST /v1/vms/test).
func (c *Client) VMTest(ctx context.Context, req VMTestRequest) (*VMTestResult, error) {
	var r VMTestResult
	return &r, c.doJSON(ctx, http.MethodPost, "/v1/vms/test", nil, req, &r)
}
