package mcp

import (
	"slices"
	"strings"
	"testing"
)

type taskInfo struct {
	TaskID    string `json:"taskId"`
	Status    string `json:"status"`
	TTL       int64  `json:"ttl"`
	CreatedAt string `json:"createdAt"`
}

type tasksReport struct {
	Capabilities struct {
		List     map[string]any `json:"list"`
		Cancel   map[string]any `json:"cancel"`
		Requests struct {
			Tools struct {
				Call map[string]any `json:"call"`
			} `json:"tools"`
		} `json:"requests"`
	} `json:"capabilities"`
	TaskSupport map[string]string `json:"task_support"`
	Short       []struct {
		Type   string `json:"type"`
		Status string `json:"status"`
		TaskID string `json:"task_id"`
		TTL    int64  `json:"ttl"`
		Error  string `json:"error"`
		Result struct {
			IsError           bool      `json:"isError"`
			StructuredContent runResult `json:"structuredContent"`
			Content           []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	} `json:"short"`
	Long struct {
		Created        taskInfo `json:"created"`
		Polls          []string `json:"polls"`
		RunningSandbox []string `json:"running_sandboxes"`
		Listed         bool     `json:"listed"`
		AfterCancel    string   `json:"after_cancel"`
		SandboxesLeft  []string `json:"sandboxes_left"`
		GoneMS         int64    `json:"gone_ms"`
		ElapsedMS      int64    `json:"elapsed_ms"`
	} `json:"long"`
	Plain struct {
		Keys   []string `json:"keys"`
		Stdout string   `json:"stdout"`
		Text   string   `json:"text"`
	} `json:"plain"`
	Reconnect *struct {
		Polls       []string `json:"polls"`
		Status      string   `json:"status"`
		Stdout      string   `json:"stdout"`
		SameSession bool     `json:"same_session"`
	} `json:"reconnect"`
	Errors []string `json:"errors"`
}

// TestTasks: long work as MCP tasks, driven by the official TypeScript
// SDK's task client (client.experimental.tasks) over HTTP and stdio. The
// server offers tasks for tools/call; the long tools say taskSupport
// optional. run_code of print(6*7) as a task ends completed with 42 in its
// result; a 90 s program is polled (working), listed, cancelled (cancelled
// at once) and its sandbox is gone long before the 90 s; a call without
// the task parameter gets today's plain result. Over HTTP a task outlives
// its client's connection: a new connection on the same session finds it
// completed with its output.
func TestTasks(t *testing.T) {
	testenv := newDaemon(t)
	for _, tc := range []struct {
		name      string
		transport map[string]any
	}{{"http", httpTransport(testenv)}, {"stdio", stdioTransport(testenv)}} {
		t.Run(tc.name, func(t *testing.T) {
			var r tasksReport
			runClient(t, "tasks", tc.transport, 0, &r)
			checkTasks(t, tc.name, &r)
		})
	}
	if ids := testenv.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

func checkTasks(t *testing.T, transport string, r *tasksReport) {
	t.Helper()
	c := r.Capabilities
	if c.List == nil || c.Cancel == nil || c.Requests.Tools.Call == nil {
		t.Errorf("server task capabilities %+v, want list, cancel and requests.tools.call", c)
	}
	for _, name := range []string{"run_code", "exec_command", "autofix", "agent_run", "image_build", "image_build_dockerfile", "sandbox_create"} {
		if r.TaskSupport[name] != "optional" {
			t.Errorf("%s taskSupport %q, want optional", name, r.TaskSupport[name])
		}
	}
	if _, ok := r.TaskSupport["sandbox_list"]; ok {
		t.Errorf("sandbox_list offers tasks: %v", r.TaskSupport)
	}

	// The short task: created, then its result.
	if n := len(r.Short); n < 2 || r.Short[0].Type != "taskCreated" || r.Short[0].Status != "working" || r.Short[0].TaskID == "" ||
		r.Short[0].TTL != 600_000 || r.Short[n-1].Type != "result" {
		t.Fatalf("run_code as a task: %+v", r.Short)
	}
	last := r.Short[len(r.Short)-1].Result
	if last.IsError || last.StructuredContent.Stdout != "42\n" || !last.StructuredContent.Success || len(last.Content) < 2 ||
		!strings.Contains(last.Content[1].Text, `"stdout":"42\n"`) {
		t.Errorf("task result: %+v", last)
	}

	// The 90 s program, polled and cancelled.
	l := r.Long
	if l.Created.Status != "working" || len(l.Polls) < 3 || slices.ContainsFunc(l.Polls, func(s string) bool { return s != "working" }) {
		t.Errorf("long task: created %+v, polls %v (want ≥ 3, all working)", l.Created, l.Polls)
	}
	if len(l.RunningSandbox) != 1 || !l.Listed {
		t.Errorf("long task: sandboxes while it ran %v (want its one), listed %v", l.RunningSandbox, l.Listed)
	}
	if l.AfterCancel != "cancelled" || len(l.SandboxesLeft) != 0 || l.ElapsedMS >= 90_000 {
		t.Errorf("after tasks/cancel: status %q, sandboxes left %v, %d ms after the task started", l.AfterCancel, l.SandboxesLeft, l.ElapsedMS)
	}
	t.Logf("%s: cancel to sandbox gone %d ms; polls %v", transport, l.GoneMS, l.Polls)

	// Without the task parameter: a plain result.
	if r.Plain.Stdout != "42\n" || slices.Contains(r.Plain.Keys, "task") || !strings.Contains(r.Plain.Text, "42") {
		t.Errorf("plain call: %+v", r.Plain)
	}

	if transport == "http" {
		rc := r.Reconnect
		if rc == nil || rc.Status != "completed" || rc.Stdout != "42\n" || !rc.SameSession || len(rc.Polls) == 0 {
			t.Errorf("task across a reconnect: %+v", rc)
		} else {
			t.Logf("after the reconnect: polls %v", rc.Polls)
		}
	}
	if len(r.Errors) > 0 {
		t.Errorf("client errors: %v", r.Errors)
	}
}
