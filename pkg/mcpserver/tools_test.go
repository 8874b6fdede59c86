package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

var allTools = []string{
	"agent_run", "autofix", "autofix_status", "autofix_submit", "exec_command", "file_delete", "file_list", "file_read", "file_write", "files_export",
	"image_build", "image_build_dockerfile", "image_delete", "image_list", "image_pull", "job_kill", "job_status",
	"languages_list", "packages_install", "quota_usage", "run_code", "run_get", "run_list", "run_replay", "run_task",
	"sandbox_create", "sandbox_expose_port", "sandbox_get", "sandbox_list", "sandbox_network", "sandbox_pause", "sandbox_restore", "sandbox_resume", "sandbox_screenshot", "sandbox_snapshot", "sandbox_terminate",
	"snapshot_delete", "snapshot_list",
	"template_create", "template_delete", "template_get", "template_list",
	"vm_test",
	"volume_create", "volume_delete", "volume_get", "volume_list",
}

func toolNames(t *testing.T, c *mcpClient) map[string]mcp.Tool {
	t.Helper()
	res, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]mcp.Tool{}
	for _, tool := range res.Tools {
		out[tool.Name] = tool
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func TestCatalogue(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	tools := toolNames(t, c)
	if got := keys(tools); !slices.Equal(got, allTools) {
		t.Fatalf("tools = %v\nwant %v", got, allTools)
	}
	for name, tool := range tools {
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too short: %q", name, tool.Description)
		}
		var in struct {
			InputSchema struct {
				Type       string         `json:"type"`
				Properties map[string]any `json:"properties"`
			} `json:"inputSchema"`
		}
		raw, _ := json.Marshal(tool)
		if err := json.Unmarshal(raw, &in); err != nil || in.InputSchema.Type != "object" {
			t.Errorf("%s: input schema %s: %v", name, raw, err)
		}
		if tool.OutputSchema.Type != "object" || len(tool.OutputSchema.Properties) == 0 {
			t.Errorf("%s: no output schema", name)
		}
		a := tool.Annotations
		if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil {
			t.Errorf("%s: annotations not all set: %+v", name, a)
			continue
		}
		readOnly := strings.HasSuffix(name, "_list") || strings.HasSuffix(name, "_get") || name == "file_read" || name == "job_status" || name == "autofix_status" || name == "sandbox_screenshot" || name == "quota_usage"
		if *a.ReadOnlyHint != readOnly || (readOnly && *a.DestructiveHint) {
			t.Errorf("%s: readOnly %v destructive %v", name, *a.ReadOnlyHint, *a.DestructiveHint)
		}
	}
	if req := tools["file_write"].InputSchema.Required; !slices.Equal(req, []string{"sandbox_id", "path", "content"}) {
		t.Errorf("file_write required = %v", req)
	}

	// Groups turned off in the configuration are not offered.
	only := newClient(t, e, Options{Tools: []string{"run"}})
	got := keys(toolNames(t, only))
	want := []string{"agent_run", "languages_list", "packages_install", "run_code", "run_get", "run_list", "run_replay", "run_task"}
	if !slices.Equal(got, want) {
		t.Errorf("tools with only the run group = %v, want %v", got, want)
	}
	if got := keys(toolNames(t, newClient(t, e, Options{Tools: []string{}}))); len(got) != 0 {
		t.Errorf("tools with no groups = %v", got)
	}
}

type execResult struct {
	JobID           string                `json:"job_id"`
	State           string                `json:"state"`
	ExitCode        *int                  `json:"exit_code"`
	Stdout          string                `json:"stdout"`
	Stderr          string                `json:"stderr"`
	StdoutTruncated bool                  `json:"stdout_truncated"`
	Termination     *apitypes.Termination `json:"termination"`
	Note            string                `json:"note"`
}

func TestTools(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})

	langs := ok[languagesOut](c, "languages_list", map[string]any{})
	var names []string
	for _, l := range langs.Languages {
		names = append(names, l.Name)
	}
	for _, want := range []string{"python", "c", "shell"} {
		if !slices.Contains(names, want) {
			t.Errorf("languages_list misses %s: %v", want, names)
		}
	}

	sb := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "python", "memory_mb": 256, "labels": map[string]string{"k": "v"}})
	if sb.ID == "" || sb.State != "ready" || sb.Language != "python" || sb.Labels["k"] != "v" || sb.Limits.MemoryBytes != 256<<20 {
		t.Fatalf("sandbox_create = %+v", sb)
	}
	if sb.Labels[SessionLabel] == "" {
		t.Errorf("sandbox created over MCP has no %s label: %v", SessionLabel, sb.Labels)
	}
	id := sb.ID

	list := ok[sandboxListOut](c, "sandbox_list", map[string]any{})
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != id || list.Total != 1 {
		t.Errorf("sandbox_list = %+v", list)
	}
	got := ok[sandboxOut](c, "sandbox_get", map[string]any{"sandbox_id": id})
	if got.ID != id || got.Usage == nil {
		t.Errorf("sandbox_get = %+v", got)
	}
	// What a container can do, and what it cannot: a screenshot is refused
	// naming the sandbox and the capability.
	if want := []string{"exec", "jobs", "pty", "files", "file_list", "ports", "file_snapshot", "pause"}; !slices.Equal(got.Capabilities, want) || got.VM != nil {
		t.Errorf("sandbox_get capabilities = %v (vm %+v), want %v", got.Capabilities, got.VM, want)
	}
	if code, msg := errCode(t, c.call("sandbox_screenshot", map[string]any{"sandbox_id": id}, nil)); code != "unavailable" || !strings.Contains(msg, id) || !strings.Contains(msg, "screenshot capability") {
		t.Errorf("sandbox_screenshot of a container: %s %s", code, msg)
	}

	t.Run("exec_command", func(t *testing.T) {
		r := ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "command": "echo out; echo err >&2; exit 3"})
		if r.State != "finished" || r.ExitCode == nil || *r.ExitCode != 3 || r.Stdout != "out\n" || r.Stderr != "err\n" || r.Termination.Cause != "exited" {
			t.Errorf("exec_command = %+v", r)
		}
		r = ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "argv": []string{"cat"}, "stdin": "in", "cwd": "/tmp", "env": map[string]string{"A": "b"}, "timeout_seconds": 10})
		if r.Stdout != "in" || *r.ExitCode != 0 {
			t.Errorf("exec_command argv = %+v", r)
		}
		r = ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "command": "sleep 10", "timeout_seconds": 0.5})
		if r.Termination.Cause != "timeout" {
			t.Errorf("timeout: %+v", r)
		}
		res := c.call("exec_command", map[string]any{"sandbox_id": id, "command": "echo hi; exit 1"}, nil)
		var fr execResult
		decodeStructured(t, res, &fr)
		if res.IsError || !strings.Contains(text(res), "exit code 1") || fr.Stdout != "hi\n" {
			t.Errorf("a failing command is a result, not an error: %v %q", res.IsError, text(res))
		}
	})

	// The contract's fields of a command's outcome reach MCP as SPEC
	// promises (issue 20: MCP dropped them): the command's own cgroup
	// usage, and the syscalls seccomp refused it, counted.
	t.Run("exec_command usage and blocked_syscalls", func(t *testing.T) {
		r := ok[execOut](c, "exec_command", map[string]any{"sandbox_id": id, "argv": []string{"python3", "-c",
			"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfor _ in range(2): libc.unshare(0x10000000)\nsum(range(10**6))"}})
		if r.ExitCode == nil || *r.ExitCode != 0 || r.Usage == nil || r.Usage.CPUSeconds <= 0 {
			t.Errorf("exec_command usage: %+v (usage %+v)", r, r.Usage)
		}
		if len(r.BlockedSyscalls) != 1 || r.BlockedSyscalls[0].Name != "unshare" || r.BlockedSyscalls[0].Count != 2 {
			t.Errorf("exec_command blocked_syscalls = %+v, want unshare ×2", r.BlockedSyscalls)
		}
	})

	t.Run("background", func(t *testing.T) {
		r := ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "background": true,
			"command": "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; echo done >&2; exit 4"})
		if r.JobID == "" || r.State != "running" || r.ExitCode != nil {
			t.Fatalf("background = %+v", r)
		}
		var stdout, stderr string
		var off, eoff int64
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := ok[jobStatusOut](c, "job_status", map[string]any{"sandbox_id": id, "job_id": r.JobID, "stdout_offset": off, "stderr_offset": eoff})
			stdout += st.Stdout
			stderr += st.Stderr
			off, eoff = st.NextStdoutOffset, st.NextStderrOffset
			if st.State == "finished" && !st.More {
				if st.ExitCode == nil || *st.ExitCode != 4 || st.Termination.Cause != "exited" {
					t.Errorf("finished job = %+v", st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("job did not finish")
			}
			time.Sleep(150 * time.Millisecond)
		}
		if stdout != "line 1\nline 2\nline 3\nline 4\nline 5\n" || stderr != "done\n" {
			t.Errorf("paged output %q %q", stdout, stderr)
		}

		r = ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "background": true, "command": "sleep 100"})
		k := ok[jobKillOut](c, "job_kill", map[string]any{"sandbox_id": id, "job_id": r.JobID, "signal": "SIGTERM"})
		if k.State != "finished" || k.Signal != "SIGTERM" {
			t.Errorf("job_kill = %+v", k)
		}
		st := ok[jobStatusOut](c, "job_status", map[string]any{"sandbox_id": id, "job_id": r.JobID})
		if st.Termination == nil || st.Termination.Cause != "signal" && st.Termination.Cause != "killed" {
			t.Errorf("killed job: %+v", st)
		}
	})

	t.Run("files", func(t *testing.T) {
		w := ok[fileOut](c, "file_write", map[string]any{"sandbox_id": id, "path": "/workspace/pkg/a.txt", "content": "héllo\n"})
		if w.Size != 7 {
			t.Errorf("file_write = %+v", w)
		}
		ok[fileOut](c, "file_write", map[string]any{"sandbox_id": id, "path": "/workspace/pkg/a.txt", "content": "more\n", "append": true})
		ok[fileOut](c, "file_write", map[string]any{"sandbox_id": id, "path": "/workspace/bin", "content": base64.StdEncoding.EncodeToString([]byte{0, 0xff, 1}), "encoding": "base64", "mode": "0755"})
		r := ok[fileReadOut](c, "file_read", map[string]any{"sandbox_id": id, "path": "/workspace/pkg/a.txt"})
		if r.Content != "héllo\nmore\n" || r.Encoding != "utf-8" || r.Truncated {
			t.Errorf("file_read = %+v", r)
		}
		r = ok[fileReadOut](c, "file_read", map[string]any{"sandbox_id": id, "path": "/workspace/bin"})
		if r.Content != "AP8B" || r.Encoding != "base64" {
			t.Errorf("binary file_read = %+v", r)
		}
		r = ok[fileReadOut](c, "file_read", map[string]any{"sandbox_id": id, "path": "/workspace/pkg/a.txt", "offset": 1, "max_bytes": 3})
		if r.Content != "él" || !r.Truncated || r.NextOffset != 4 {
			t.Errorf("paged file_read = %+v", r)
		}
		l := ok[fileListOut](c, "file_list", map[string]any{"sandbox_id": id, "recursive": true})
		var paths []string
		for _, fe := range l.Entries {
			paths = append(paths, fe.Path)
		}
		for _, want := range []string{"/workspace/pkg", "/workspace/pkg/a.txt", "/workspace/bin"} {
			if !slices.Contains(paths, want) {
				t.Errorf("file_list misses %s: %v", want, paths)
			}
		}
		ex := ok[filesExportOut](c, "files_export", map[string]any{"sandbox_id": id})
		if ex.Size == 0 || len(ex.SHA256) != 64 || ex.DownloadPath != "/v1/artifacts/"+ex.ID {
			t.Errorf("files_export = %+v", ex)
		}
		if code, _ := errCode(t, c.call("files_export", map[string]any{"sandbox_id": id, "path": "/workspace/nope"}, nil)); code != "not_found" {
			t.Errorf("files_export of a missing dir: %q", code)
		}
		d := ok[fileDeleteOut](c, "file_delete", map[string]any{"sandbox_id": id, "path": "/workspace/pkg", "recursive": true})
		if d.Path != "/workspace/pkg" {
			t.Errorf("file_delete = %+v", d)
		}
		if code, _ := errCode(t, c.call("file_read", map[string]any{"sandbox_id": id, "path": "/workspace/pkg/a.txt"}, nil)); code != "not_found" {
			t.Errorf("read after delete: %q", code)
		}
	})

	var runID string
	t.Run("run_code", func(t *testing.T) {
		r := ok[runCodeOut](c, "run_code", map[string]any{"language": "python", "code": "import sys\nprint('hi', sys.argv[1:], input())\n", "args": []string{"a"}, "stdin": "x\n"})
		if !r.Success || r.Stdout != "hi ['a'] x\n" || r.RunID == "" || len(r.Steps) != 1 || r.Steps[0].Name != "run" {
			t.Fatalf("run_code python = %+v", r)
		}
		runID = r.RunID
		r = ok[runCodeOut](c, "run_code", map[string]any{"language": "c", "code": "int main(void) { return x; }\n"})
		if r.Success || len(r.Steps) != 1 || r.Steps[0].Name != "compile" || r.ExitCode == 0 || !strings.Contains(r.Stderr, "error") {
			t.Errorf("run_code C compile error = %+v", r)
		}
		// cpus reached run_code through the contract alone (apitypes): the
		// fresh sandbox's CPU quota is a quarter of a core.
		r = ok[runCodeOut](c, "run_code", map[string]any{"language": "shell", "cpus": 0.25,
			"code": "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us\n"})
		if f := strings.Fields(r.Stdout); !r.Success || len(f) != 2 || f[0] != "25000" || f[1] != "100000" {
			t.Errorf("run_code with cpus 0.25: quota and period %q, want 25000 100000 (%+v)", r.Stdout, r)
		}
		r = ok[runCodeOut](c, "run_code", map[string]any{"language": "python", "sandbox_id": id, "files": map[string]string{"main.py": "import helper\nhelper.go()\n", "helper.py": "def go():\n    print(42)\n"}})
		if !r.Success || r.Stdout != "42\n" || r.SandboxID != id {
			t.Errorf("run_code in a sandbox = %+v", r)
		}
	})

	t.Run("run_task", func(t *testing.T) {
		ok[fileOut](c, "file_write", map[string]any{"sandbox_id": id, "path": "/workspace/test_x.py", "content": "def test_x():\n    assert 1 + 1 == 2\n"})
		r := ok[execResult](c, "run_task", map[string]any{"sandbox_id": id, "task": "test"})
		if *r.ExitCode != 0 || !strings.Contains(r.Stdout, "passed") {
			t.Errorf("run_task test = %+v", r)
		}
	})

	t.Run("packages_install", func(t *testing.T) {
		whl := testenv.Wheel(t, "localpkg", "1.0", "X = 7\n")
		ok[fileOut](c, "file_write", map[string]any{"sandbox_id": id, "path": "/workspace/localpkg-1.0-py3-none-any.whl", "content": base64.StdEncoding.EncodeToString(whl), "encoding": "base64"})
		r := ok[execResult](c, "packages_install", map[string]any{"sandbox_id": id, "manager": "pip", "packages": []string{"./localpkg-1.0-py3-none-any.whl"}})
		if *r.ExitCode != 0 {
			t.Fatalf("packages_install = %+v", r)
		}
		run := ok[runCodeOut](c, "run_code", map[string]any{"language": "python", "sandbox_id": id, "code": "import localpkg\nprint(localpkg.X)\n"})
		if run.Stdout != "7\n" {
			t.Errorf("import after packages_install: %+v", run)
		}
		code, msg := errCode(t, c.call("packages_install", map[string]any{"sandbox_id": id, "manager": "pip", "packages": []string{"requests"}}, nil))
		if code != "unavailable" || !strings.Contains(msg, "network") {
			t.Errorf("pip install without network: %s %s", code, msg)
		}
	})

	t.Run("runs", func(t *testing.T) {
		rec := ok[runGetOut](c, "run_get", map[string]any{"run_id": runID})
		if rec.Metadata.RunID != runID || rec.Stdout != "hi ['a'] x\n" || !rec.Metadata.Success {
			t.Errorf("run_get = %+v", rec)
		}
		rl := ok[runListOut](c, "run_list", map[string]any{"language": "python", "limit": 10})
		if len(rl.Runs) < 3 {
			t.Errorf("run_list = %d runs", len(rl.Runs))
		}
		for _, m := range rl.Runs {
			if m.Language != "python" {
				t.Errorf("run_list language filter: %+v", m)
			}
		}
		failed := ok[runListOut](c, "run_list", map[string]any{"success": false})
		if len(failed.Runs) != 1 || failed.Runs[0].Language != "c" {
			t.Errorf("run_list success=false = %+v", failed.Runs)
		}
	})

	term := ok[sandboxTerminateOut](c, "sandbox_terminate", map[string]any{"sandbox_id": id})
	if term.SandboxID != id || term.State != "terminated" {
		t.Errorf("sandbox_terminate = %+v", term)
	}
	// Idempotent.
	if term := ok[sandboxTerminateOut](c, "sandbox_terminate", map[string]any{"sandbox_id": id}); term.State != "terminated" {
		t.Errorf("second terminate = %+v", term)
	}
	if all := ok[sandboxListOut](c, "sandbox_list", map[string]any{"state": "all"}); all.Total < 1 {
		t.Errorf("sandbox_list all = %+v", all)
	}
}

// TestBadInput calls every tool with each kind of bad input and checks the
// taxonomy code of the error result.
func TestBadInput(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	live := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "python"}).ID
	dead := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"}).ID
	ok[sandboxTerminateOut](c, "sandbox_terminate", map[string]any{"sandbox_id": dead})
	const unknown = "sb-000000000000"

	// Valid arguments of every tool that takes a sandbox, with the sandbox
	// left to fill in.
	withSandbox := map[string]map[string]any{
		"sandbox_get":      {},
		"exec_command":     {"command": "true"},
		"job_status":       {"job_id": "j-0123456789abcdef"},
		"job_kill":         {"job_id": "j-0123456789abcdef"},
		"run_task":         {"task": "test"},
		"file_write":       {"path": "/workspace/x", "content": "x"},
		"file_read":        {"path": "/workspace/x"},
		"file_list":        {},
		"file_delete":      {"path": "/workspace/x"},
		"files_export":     {},
		"packages_install": {"manager": "pip", "packages": []string{"x"}},
		"run_code":         {"language": "python", "code": "print(1)"},
	}
	type tc struct {
		name, tool string
		args       map[string]any
		code       string
		in         string // the message names this
	}
	var cases []tc
	for tool, args := range withSandbox {
		with := func(id string) map[string]any {
			m := map[string]any{"sandbox_id": id}
			for k, v := range args {
				m[k] = v
			}
			return m
		}
		deadCode, deadIn := "conflict", "terminated"
		if tool == "sandbox_get" { // describing a terminated sandbox is fine
			deadCode, deadIn = "", ""
		}
		cases = append(cases,
			tc{"unknown sandbox", tool, with(unknown), "not_found", ""},
			tc{"terminated sandbox", tool, with(dead), deadCode, deadIn},
			tc{"wrong type", tool, with(live), "invalid_argument", "sandbox_id"},
		)
		cases[len(cases)-1].args["sandbox_id"] = 12345
		if tool != "run_code" {
			m := with(live)
			delete(m, "sandbox_id")
			cases = append(cases, tc{"missing sandbox_id", tool, m, "invalid_argument", "sandbox_id"})
		}
	}
	cases = append(cases,
		tc{"missing content", "file_write", map[string]any{"sandbox_id": live, "path": "/workspace/x"}, "invalid_argument", "content"},
		tc{"missing path", "file_read", map[string]any{"sandbox_id": live}, "invalid_argument", "path"},
		tc{"missing language", "run_code", map[string]any{"code": "print(1)"}, "invalid_argument", "language"},
		tc{"missing task", "run_task", map[string]any{"sandbox_id": live}, "invalid_argument", "task"},
		tc{"missing run_id", "run_get", map[string]any{}, "invalid_argument", "run_id"},
		tc{"missing job_id", "job_status", map[string]any{"sandbox_id": live}, "invalid_argument", "job_id"},
		tc{"missing packages", "packages_install", map[string]any{"sandbox_id": live, "manager": "pip"}, "invalid_argument", "packages"},
		tc{"missing command", "exec_command", map[string]any{"sandbox_id": live}, "invalid_argument", "command"},
		tc{"wrong type timeout", "exec_command", map[string]any{"sandbox_id": live, "command": "true", "timeout_seconds": "ten"}, "invalid_argument", "timeout_seconds"},
		tc{"wrong type background", "exec_command", map[string]any{"sandbox_id": live, "command": "true", "background": "yes"}, "invalid_argument", "background"},
		tc{"wrong type memory", "sandbox_create", map[string]any{"language": "python", "memory_mb": "lots"}, "invalid_argument", "memory_mb"},
		tc{"wrong type files", "run_code", map[string]any{"language": "python", "files": []string{"a.py"}}, "invalid_argument", "files"},
		tc{"wrong type packages", "packages_install", map[string]any{"sandbox_id": live, "manager": "pip", "packages": "x"}, "invalid_argument", "packages"},
		tc{"wrong type limit", "run_list", map[string]any{"limit": "many"}, "invalid_argument", "limit"},
		tc{"unknown field", "sandbox_list", map[string]any{"colour": "red"}, "invalid_argument", "colour"},
		tc{"unknown language", "sandbox_create", map[string]any{"language": "cobol"}, "invalid_argument", "language"},
		tc{"unknown language", "run_code", map[string]any{"language": "cobol", "code": "x"}, "invalid_argument", "language"},
		tc{"bad state", "sandbox_list", map[string]any{"state": "asleep"}, "invalid_argument", "state"},
		tc{"unknown run", "run_get", map[string]any{"run_id": "20200101_000000_abcd"}, "not_found", ""},
		tc{"unknown job", "job_status", map[string]any{"sandbox_id": live, "job_id": "j-0123456789abcdef"}, "not_found", ""},
		tc{"bad signal", "job_kill", map[string]any{"sandbox_id": live, "job_id": "j-0123456789abcdef", "signal": "SIGNOPE"}, "invalid_argument", "signal"},
		tc{"bad task", "run_task", map[string]any{"sandbox_id": live, "task": "deploy"}, "invalid_argument", "task"},
		tc{"bad manager", "packages_install", map[string]any{"sandbox_id": live, "manager": "apt", "packages": []string{"x"}}, "invalid_argument", "manager"},
		// Paths outside the sandbox's reach.
		tc{"relative path", "file_write", map[string]any{"sandbox_id": live, "path": "../../etc/passwd", "content": "x"}, "invalid_argument", "path"},
		tc{"relative path", "file_read", map[string]any{"sandbox_id": live, "path": "../etc/shadow"}, "invalid_argument", "path"},
		tc{"relative path", "file_list", map[string]any{"sandbox_id": live, "path": "workspace/.."}, "invalid_argument", "path"},
		tc{"delete root", "file_delete", map[string]any{"sandbox_id": live, "path": "/workspace/../..", "recursive": true}, "invalid_argument", "path"},
		tc{"relative cwd", "exec_command", map[string]any{"sandbox_id": live, "command": "true", "cwd": "../.."}, "invalid_argument", "cwd"},
		tc{"file outside workspace", "run_code", map[string]any{"language": "python", "files": map[string]string{"../../etc/x.py": "1", "main.py": "1"}}, "invalid_argument", "files"},
		tc{"absolute outside", "run_code", map[string]any{"language": "python", "files": map[string]string{"/etc/passwd": "x", "main.py": "1"}}, "invalid_argument", "files"},
		tc{"task path outside", "run_task", map[string]any{"sandbox_id": live, "task": "test", "path": "../etc"}, "invalid_argument", "path"},
	)
	for _, k := range cases {
		t.Run(k.tool+"/"+k.name, func(t *testing.T) {
			res := c.call(k.tool, k.args, nil)
			code, msg := errCode(t, res)
			if code != k.code {
				t.Fatalf("code %q (%s), want %q; result %s", code, msg, k.code, text(res))
			}
			if !strings.Contains(msg, k.in) {
				t.Errorf("message %q does not name %q", msg, k.in)
			}
		})
	}
	// The read-only file system holds whatever path a write names.
	if code, _ := errCode(t, c.call("file_write", map[string]any{"sandbox_id": live, "path": "/etc/passwd", "content": "x"}, nil)); code == "" {
		t.Error("writing /etc/passwd in the sandbox succeeded")
	}
	// Nothing was created along the way.
	if l := ok[sandboxListOut](c, "sandbox_list", map[string]any{}); l.Total != 1 {
		t.Errorf("live sandboxes after bad input: %+v", l.Sandboxes)
	}
}

// TestProgressAndSize checks progress notifications of a streaming command
// and that long output is cut to the result budget with a marker.
func TestProgressAndSize(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{MaxResultBytes: 16 << 10})
	id := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"}).ID

	res := c.call("exec_command", map[string]any{"sandbox_id": id,
		"command": "for i in $(seq 20); do echo line $i; sleep 0.1; done"}, &mcp.Meta{ProgressToken: "p1"})
	if res.IsError {
		t.Fatal(text(res))
	}
	var msgs []string
	last := -1.0
	for _, n := range c.notifications() {
		if n.Method != "notifications/progress" {
			continue
		}
		p := n.Params.AdditionalFields
		if p["progressToken"] != "p1" {
			t.Errorf("progress token %v", p["progressToken"])
		}
		var v float64
		fmt.Sscan(fmt.Sprint(p["progress"]), &v)
		if v <= last {
			t.Errorf("progress not increasing: %v after %v", v, last)
		} else {
			last = v
		}
		m, _ := p["message"].(string)
		msgs = append(msgs, m)
	}
	if len(msgs) < 10 || !strings.Contains(strings.Join(msgs, ""), "line 20\n") {
		t.Errorf("%d progress notifications: %q", len(msgs), msgs)
	}

	// 1 MiB of output comes back cut to the budget, head and tail kept.
	res = c.call("exec_command", map[string]any{"sandbox_id": id,
		"command": "echo FIRST; head -c 1048576 /dev/zero | tr '\\0' 'x'; echo; echo '<LAST>' >&2; echo LAST"}, nil)
	// The budget holds for what a client hands its model (either copy of
	// the output); the wire carries both copies.
	if v, b := viewBytes(res), wireBytes(res); v > 16<<10 || b > 3*16<<10 {
		t.Errorf("result is %d bytes as a model sees it, %d on the wire; budget 16 KiB", v, b)
	}
	var r execResult
	decodeStructured(t, res, &r)
	if !strings.HasPrefix(r.Stdout, "FIRST\n") || !strings.HasSuffix(r.Stdout, "LAST\n") || !strings.Contains(r.Stdout, "bytes cut here") || !r.StdoutTruncated || r.Note == "" {
		t.Errorf("cut output: %d bytes, truncated %v, note %q, head %q", len(r.Stdout), r.StdoutTruncated, r.Note, r.Stdout[:min(80, len(r.Stdout))])
	}
	// One copy of the output: the text part is a summary, the structured
	// content carries the output and spends (nearly) the whole budget.
	if strings.Contains(text(res), "xxxx") || len(text(res)) > 512 || !strings.Contains(r.Stderr, "<LAST>") {
		t.Errorf("text part %d bytes: %q…", len(text(res)), text(res)[:min(200, len(text(res)))])
	}
	if len(r.Stdout) < 12<<10 {
		t.Errorf("structured stdout carries %d bytes of a 16 KiB budget", len(r.Stdout))
	}

	// With the default budget (48K), 1 MB of output gives the model at
	// least 40 KB of it, head and tail around the marker.
	dc := newClient(t, e, Options{})
	res = dc.call("exec_command", map[string]any{"sandbox_id": id,
		"command": "echo FIRST; seq 1 200000 | head -c 1000000; echo; echo LAST"}, nil)
	b := viewBytes(res)
	r = execResult{}
	decodeStructured(t, res, &r)
	if len(r.Stdout) < 40<<10 || b > 48<<10 || wireBytes(res) > 3*48<<10 || !strings.HasPrefix(r.Stdout, "FIRST\n") || !strings.HasSuffix(r.Stdout, "LAST\n") || !strings.Contains(r.Stdout, "bytes cut here") {
		t.Errorf("1 MB output: structured stdout %d bytes, result %d bytes, head %q", len(r.Stdout), b, r.Stdout[:min(40, len(r.Stdout))])
	}
	t.Logf("1 MB output: %d bytes of it in a %d-byte result (%d on the wire)", len(r.Stdout), b, wireBytes(res))

	// run_code: the marker points at the run record, which has it all.
	res = c.call("run_code", map[string]any{"language": "shell", "code": "seq 1 100000\n"}, nil)
	b = viewBytes(res)
	var rr runCodeOut
	decodeStructured(t, res, &rr)
	if b > 16<<10 || !strings.Contains(rr.Stdout, "run_get") || !strings.HasSuffix(rr.Stdout, "100000\n") {
		t.Errorf("run_code cut: %d bytes, %q", b, rr.Note)
	}
	// The whole log as a resource (the first MiB; this one is 588895 bytes).
	rreq := mcp.ReadResourceRequest{}
	rreq.Params.URI = "run://" + rr.RunID + "/stdout.log"
	rres, err := c.ReadResource(context.Background(), rreq)
	if err != nil || len(rres.Contents) != 1 {
		t.Fatalf("resource %s: %v", rreq.Params.URI, err)
	}
	if tc, _ := rres.Contents[0].(mcp.TextResourceContents); len(tc.Text) != 588895 || !strings.HasSuffix(tc.Text, "\n100000\n") {
		t.Errorf("resource %s: %d bytes", rreq.Params.URI, len(tc.Text))
	}
	rreq.Params.URI = "run://" + rr.RunID + "/secret"
	if _, err := c.ReadResource(context.Background(), rreq); err == nil || !strings.Contains(err.Error(), "uri") {
		t.Errorf("resource %s: %v", rreq.Params.URI, err)
	}
	rec := ok[runGetOut](c, "run_get", map[string]any{"run_id": rr.RunID})
	if rec.Metadata.StdoutBytes != 588895 || !strings.Contains(rec.Stdout, "stdout.log") {
		t.Errorf("run_get of a long run: %d bytes, note %q", rec.Metadata.StdoutBytes, rec.Note)
	}

	// job_status pages a long output in bounded pages that add up.
	job := ok[execResult](c, "exec_command", map[string]any{"sandbox_id": id, "background": true, "command": "seq 1 30000"})
	var all strings.Builder
	var off int64
	pages := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); pages++ {
		res := c.call("job_status", map[string]any{"sandbox_id": id, "job_id": job.JobID, "stdout_offset": off}, nil)
		if b := viewBytes(res); b > 16<<10 {
			t.Fatalf("job_status page of %d bytes", b)
		}
		var st jobStatusOut
		decodeStructured(t, res, &st)
		all.WriteString(st.Stdout)
		off = st.NextStdoutOffset
		if st.State == "finished" && !st.More {
			break
		}
	}
	var want strings.Builder
	for i := 1; i <= 30000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if all.String() != want.String() || pages < 5 {
		t.Errorf("paged %d bytes in %d pages, want %d", all.Len(), pages, want.Len())
	}
}

// TestSessionEnd: with mcp_on_session_end: terminate, the sandboxes a stdio
// session created go when its input ends; others stay.
func TestSessionEnd(t *testing.T) {
	e := newEngine(t)
	other := ok[sandboxOut](newClient(t, e, Options{}), "sandbox_create", map[string]any{"language": "shell"}).ID

	inR, inW := ioPipe()
	outR, outW := ioPipe()
	done := make(chan error, 1)
	go func() {
		done <- ServeStdio(context.Background(), e, Options{OnSessionEnd: config.SessionEndTerminate}, inR, outW)
	}()
	sc := newLineClient(t, inW, outR)
	sc.initialize()
	res := sc.callTool("sandbox_create", map[string]any{"language": "shell"})
	mine, _ := res["structuredContent"].(map[string]any)["sandbox_id"].(string)
	if mine == "" {
		t.Fatalf("sandbox_create over stdio: %v", res)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ServeStdio did not return at the end of its input")
	}
	d, err := e.GetSandbox(context.Background(), mine)
	if err != nil || d.State != "terminated" {
		t.Errorf("session's sandbox after the session: %+v %v", d, err)
	}
	if d, err := e.GetSandbox(context.Background(), other); err != nil || d.State != "ready" {
		t.Errorf("another session's sandbox: %+v %v", d, err)
	}
}
