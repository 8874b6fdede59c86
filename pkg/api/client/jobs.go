package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// JobInfo describes a command a sandbox's agent knows about.
type JobInfo = apitypes.JobInfo

// JobStatus is a job's state and a page of its output.
type JobStatus = apitypes.JobStatus

// StartJob runs a command in the background and returns its job id.
func (c *Client) StartJob(ctx context.Context, id string, req ExecRequest) (string, error) {
	var out struct {
		JobID string `json:"job_id"`
	}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/jobs"), nil, req, &out, http.StatusAccepted); err != nil {
		return "", err
	}
	return out.JobID, nil
}

// Jobs lists the commands of a sandbox.
func (c *Client) Jobs(ctx context.Context, id string) ([]JobInfo, error) {
	var out struct {
		Jobs []JobInfo `json:"jobs"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/jobs"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Jobs, nil
}

// JobStatus reads a page of a job's output after the given offsets.
func (c *Client) JobStatus(ctx context.Context, id, jobID string, stdoutOff, stderrOff int64, max int) (*JobStatus, error) {
	q := url.Values{}
	q.Set("stdout_offset", strconv.FormatInt(stdoutOff, 10))
	q.Set("stderr_offset", strconv.FormatInt(stderrOff, 10))
	if max > 0 {
		q.Set("max_bytes", strconv.Itoa(max))
	}
	var out JobStatus
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/jobs/"+url.PathEscape(jobID)), q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// KillJob signals a job (default SIGKILL) and says its state after a short
// wait for it to end.
func (c *Client) KillJob(ctx context.Context, id, jobID, signal string) (*apitypes.JobKillResult, error) {
	q := url.Values{}
	if signal != "" {
		q.Set("signal", signal)
	}
	var res apitypes.JobKillResult
	if err := c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "/jobs/"+url.PathEscape(jobID)), q, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RunTask runs one of the sandbox's language's tasks (lint, build, test)
// and waits for it (POST /v1/sandboxes/{id}/tasks).
func (c *Client) RunTask(ctx context.Context, req apitypes.RunTaskRequest) (*ExecResult, error) {
	var res ExecResult
	return &res, c.doJSON(ctx, http.MethodPost, sandboxPath(req.SandboxID, "/tasks"), nil, req, &res)
}

// PackagesInstall installs packages with one of the sandbox's language's
// managers and waits for it (POST /v1/sandboxes/{id}/packages).
func (c *Client) PackagesInstall(ctx context.Context, req apitypes.PackagesInstallRequest) (*ExecResult, error) {
	var res ExecResult
	return &res, c.doJSON(ctx, http.MethodPost, sandboxPath(req.SandboxID, "/packages"), nil, req, &res)
}
