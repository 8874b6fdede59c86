package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// JobInfo describes a command a sandbox's agent knows about.
type JobInfo struct {
	ID          string    `json:"id"`
	Argv        []string  `json:"argv"`
	PID         int       `json:"pid"`
	State       string    `json:"state"`
	TTY         bool      `json:"tty,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	StdoutBytes int64     `json:"stdout_bytes"`
	StderrBytes int64     `json:"stderr_bytes"`
	Exit        *JobExit  `json:"exit,omitempty"`
}

// JobExit is how a job ended, as the agent reports it.
type JobExit struct {
	Cause      string    `json:"cause"`
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	Detail     string    `json:"detail,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS int64     `json:"duration_ms"`
}

// JobStatus is a job's state and a page of its output.
type JobStatus struct {
	JobID            string       `json:"job_id"`
	State            string       `json:"state"`
	Stdout           string       `json:"stdout"`
	Stderr           string       `json:"stderr"`
	StdoutOffset     int64        `json:"stdout_offset"`
	StderrOffset     int64        `json:"stderr_offset"`
	NextStdoutOffset int64        `json:"next_stdout_offset"`
	NextStderrOffset int64        `json:"next_stderr_offset"`
	ExitCode         *int         `json:"exit_code,omitempty"`
	Termination      *Termination `json:"termination,omitempty"`
	DurationMS       int64        `json:"duration_ms,omitempty"`
}

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

// KillJob signals a job (default SIGKILL).
func (c *Client) KillJob(ctx context.Context, id, jobID, signal string) error {
	q := url.Values{}
	if signal != "" {
		q.Set("signal", signal)
	}
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "/jobs/"+url.PathEscape(jobID)), q, nil, nil)
}
