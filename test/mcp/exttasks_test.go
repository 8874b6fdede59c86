package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

type rpcOutcome struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"data"`
	Result map[string]any `json:"result"`
}

type extTasksReport struct {
	Era       string         `json:"era"`
	Version   string         `json:"version"`
	Extension map[string]any `json:"extension"`
	Short     struct {
		Kind   string   `json:"kind"`
		TaskID string   `json:"task_id"`
		Events []string `json:"events"`
		Status string   `json:"status"`
		Result struct {
			IsError           bool      `json:"isError"`
			StructuredContent runResult `json:"structuredContent"`
			Content           []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	} `json:"short"`
	Long struct {
		Kind             string   `json:"kind"`
		TaskID           string   `json:"task_id"`
		Polls            []string `json:"polls"`
		PollIntervalMS   int64    `json:"poll_interval_ms"`
		TTLMS            int64    `json:"ttl_ms"`
		ProcsWorking     int      `json:"procs_working"`
		SandboxesWorking []string `json:"sandboxes_working"`
		AfterCancel      string   `json:"after_cancel"`
		ProcsAfter       int      `json:"procs_after"`
		SandboxesAfter   []string `json:"sandboxes_after"`
		GoneMS           int64    `json:"gone_ms"`
		ElapsedMS        int64    `json:"elapsed_ms"`
		Outcome          string   `json:"outcome"`
	} `json:"long"`
	Foreign *struct {
		Get    rpcOutcome `json:"get"`
		Cancel rpcOutcome `json:"cancel"`
		After  string     `json:"after"`
		Own    struct {
			Kind   string `json:"kind"`
			Status string `json:"status"`
			Stdout string `json:"stdout"`
		} `json:"own"`
		TheirsHere rpcOutcome `json:"theirs_here"`
	} `json:"foreign"`
	Invalid map[string]rpcOutcome `json:"invalid"`
	Plain   struct {
		Keys   []string `json:"keys"`
		Stdout string   `json:"stdout"`
		Text   string   `json:"text"`
	} `json:"plain"`
	Errors []string `json:"errors"`
	Fatal  string   `json:"fatal"`
}

// TestExtTasks: the 2026-07-28 tasks extension (io.modelcontextprotocol/tasks)
// with the official TypeScript SDK v2 (@modelcontextprotocol/client 2.4.0)
// and the official extension package (@modelcontextprotocol/ext-tasks
// 0.2.2), over HTTP and stdio. The client negotiates 2026-07-28 and finds
// the extension declared; run_code of print(6*7) comes back as a task that
// the package settles by polling, completed with 42 in its result; a 90 s
// program is a task polled while working (its sleep process seen on the
// host, its sandbox listed), then cancelled: the status is cancelled, the
// process and the sandbox gone long before the 90 s. Over HTTP another API
// key can neither see nor cancel it (not found, as for an id that does not
// exist). Bad task ids and params are JSON-RPC errors with our code naming
// the field; a request that does not declare the extension gets -32021;
// and the same client calling without the extension gets today's result.
func TestExtTasks(t *testing.T) {
	auditDir := filepath.Join(t.TempDir(), "audit")
	d := newDaemon(t, func(c *config.Config) { c.Audit.Enabled, c.Audit.Dir = true, auditDir })
	extTasksNode(t)
	var foreign struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("--json", "keys", "create", "ext-tasks-other")), &foreign); err != nil || foreign.Secret == "" {
		t.Fatalf("keys create: %v", err)
	}
	for _, tc := range []struct {
		name      string
		transport map[string]any
	}{{"http", httpTransport(d)}, {"stdio", stdioTransport(d)}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "http" {
				tc.transport["foreign"] = foreign.Secret
			}
			marker := fmt.Sprintf("90.%06d", rand.IntN(1_000_000))
			var r extTasksReport
			runExtTasksClient(t, tc.transport, marker, &r)
			checkExtTasks(t, tc.name, &r)
		})
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
	// A task's work runs as the key that asked for it: the other key's
	// run_code is in the audit log under its name and tenant.
	if !slices.ContainsFunc(auditRecords(t, auditDir), func(rec audit.Record) bool {
		return rec.Action == "mcp:run_code" && rec.KeyName == "ext-tasks-other" && rec.Tenant == "ext-tasks-other" && !rec.Admin && rec.Outcome == audit.Success
	}) {
		t.Error("no audit record of the other key's run_code task under its own key")
	}
}

func checkExtTasks(t *testing.T, transport string, r *extTasksReport) {
	t.Helper()
	if r.Era != "modern" || r.Version != "2026-07-28" || r.Extension == nil || len(r.Extension) != 0 {
		t.Errorf("negotiated era %q version %q, extension %v: want modern 2026-07-28 and {}", r.Era, r.Version, r.Extension)
	}

	s := r.Short
	if s.Kind != "task" || !strings.HasPrefix(s.TaskID, "task-") || s.Status != "completed" || len(s.Events) == 0 ||
		s.Events[len(s.Events)-1] != "outcome:completed" {
		t.Errorf("short run_code: %+v", s)
	}
	if s.Result.IsError || s.Result.StructuredContent.Stdout != "42\n" || !s.Result.StructuredContent.Success || len(s.Result.Content) < 2 ||
		!strings.Contains(s.Result.Content[1].Text, `"stdout":"42\n"`) {
		t.Errorf("short task's result: %+v", s.Result)
	}

	l := r.Long
	if l.Kind != "task" || len(l.Polls) < 3 || slices.ContainsFunc(l.Polls, func(p string) bool { return p != "working" }) ||
		l.PollIntervalMS != 1000 || l.TTLMS != time.Hour.Milliseconds() {
		t.Errorf("long task: kind %q polls %v (want ≥ 3, all working), pollIntervalMs %d, ttlMs %d", l.Kind, l.Polls, l.PollIntervalMS, l.TTLMS)
	}
	// The process check can fail: the sleep was seen while the task worked.
	if l.ProcsWorking != 1 || len(l.SandboxesWorking) != 1 {
		t.Errorf("while working: %d sleep processes (want 1), sandboxes %v (want its one)", l.ProcsWorking, l.SandboxesWorking)
	}
	if l.AfterCancel != "cancelled" || l.Outcome != "cancelled" || l.ProcsAfter != 0 || len(l.SandboxesAfter) != 0 || l.ElapsedMS >= 90_000 {
		t.Errorf("after tasks/cancel: status %q outcome %q, %d sleep processes, sandboxes %v, %d ms after the start",
			l.AfterCancel, l.Outcome, l.ProcsAfter, l.SandboxesAfter, l.ElapsedMS)
	}
	t.Logf("%s: cancel to process and sandbox gone %d ms; polls %v", transport, l.GoneMS, l.Polls)

	if transport == "http" {
		f := r.Foreign
		if f == nil {
			t.Fatal("no foreign-key report")
		}
		for name, o := range map[string]rpcOutcome{"tasks/get": f.Get, "tasks/cancel": f.Cancel} {
			if o.Code != -32602 || o.Data.Error.Code != "not_found" || !strings.Contains(o.Message, "taskId") || o.Result != nil {
				t.Errorf("another key's %s: %+v, want -32602 not_found naming taskId", name, o)
			}
		}
		if f.Own.Kind != "task" || f.Own.Status != "completed" || f.Own.Stdout != "other key\n" {
			t.Errorf("the other key's own task: %+v", f.Own)
		}
		if o := f.TheirsHere; o.Code != -32602 || o.Data.Error.Code != "not_found" || o.Result != nil {
			t.Errorf("the other key's task seen from the first: %+v, want not found", o)
		}
		if f.After != "working" {
			t.Errorf("after another key's tasks/cancel the task is %q, want working", f.After)
		}
	}

	want := map[string]struct {
		code, errCode, says string
	}{
		"missing":    {"-32602", "invalid_argument", "taskId: required"},
		"number":     {"-32602", "invalid_argument", "taskId: must be a string"},
		"empty":      {"-32602", "invalid_argument", "taskId: must not be empty"},
		"long":       {"-32602", "invalid_argument", "taskId: longer than"},
		"unknown":    {"-32602", "not_found", "taskId: no task"},
		"update":     {"-32602", "invalid_argument", "inputResponses: must be an object"},
		"undeclared": {"-32021", "", "io.modelcontextprotocol/tasks"},
	}
	for name, w := range want {
		o, ok := r.Invalid[name]
		if !ok || fmt.Sprint(o.Code) != w.code || o.Data.Error.Code != w.errCode || !strings.Contains(o.Message, w.says) {
			t.Errorf("%s: %+v, want %s %s saying %q", name, o, w.code, w.errCode, w.says)
		}
	}

	if r.Plain.Stdout != "42\n" || slices.Contains(r.Plain.Keys, "taskId") || !strings.Contains(r.Plain.Text, `"stdout":"42\n"`) {
		t.Errorf("call without the extension: %+v", r.Plain)
	}
	if len(r.Errors) > 0 {
		t.Errorf("client errors: %v", r.Errors)
	}
}

// extTasksNode checks that test/mcp/exttasks has its packages (npm ci by
// scripts/install-deps.sh).
func extTasksNode(t *testing.T) {
	t.Helper()
	cmd := exec.Command("node", "--input-type=module", "-e", `await import("@modelcontextprotocol/ext-tasks/client"); await import("@modelcontextprotocol/client")`)
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "mcp", "exttasks")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("test/mcp/exttasks has no @modelcontextprotocol/client and ext-tasks (run scripts/install-deps.sh): %v\n%s", err, out)
	}
}

func runExtTasksClient(t *testing.T, transport map[string]any, marker string, v *extTasksReport) {
	t.Helper()
	spec, _ := json.Marshal(transport)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", string(spec), marker)
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "mcp", "exttasks")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if jerr := json.Unmarshal(stdout.Bytes(), v); jerr != nil || err != nil || v.Fatal != "" {
		t.Fatalf("node exttasks/client.mjs: %v %v\n%s\n%v\nstderr: %s", err, jerr, v.Fatal, v.Errors, stderr.String())
	}
}
