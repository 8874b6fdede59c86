package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// VM types of the contract (pkg/apitypes). A VM is a sandbox
// (CreateSandboxRequest{Backend: "vm"}); what only it has is VMInfo.
type (
	VMInfo        = apitypes.VMInfo
	VMTestRequest = apitypes.VMTestRequest
	VMTestResult  = apitypes.VMTestResult
)

// CreateLine is one line of the create stream (POST /v1/sandboxes?stream=true).
type CreateLine = apitypes.CreateLine

// CreateSandboxProgress is CreateSandbox whose onLog sees the progress
// lines of a slow start (a VM's guest image built on its first use, a disk
// guest booting) as they come.
func (c *Client) CreateSandboxProgress(ctx context.Context, req CreateSandboxRequest, onLog func(string)) (*Sandbox, error) {
	if onLog == nil {
		return c.CreateSandbox(ctx, req)
	}
	return postStream(ctx, c, "/v1/sandboxes", url.Values{"stream": {"true"}}, req, "create", func(line *CreateLine) (bool, *Sandbox, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Sandbox != nil:
			return true, line.Sandbox, nil
		case line.Log != "":
			onLog(line.Log)
		}
		return false, nil, nil
	})
}

// Screenshot returns a sandbox's screen as PNG (a VM's display).
func (c *Client) Screenshot(ctx context.Context, id string) ([]byte, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/screenshot", nil, nil)
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

// VMTest runs a vm_test (POST /v1/vm-test).
func (c *Client) VMTest(ctx context.Context, req VMTestRequest) (*VMTestResult, error) {
	var r VMTestResult
	return &r, c.doJSON(ctx, http.MethodPost, "/v1/vm-test", nil, req, &r)
}
