package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/contract"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// fakeEngine answers the MCP tools' engine calls from memory, so that the
// tools' decode and encode tests run as any user: no root, no images. Each
// method answers an example value with every field set
// (contract.Example), or err when set, and records what it was given. A
// method the tests do not need panics (the nil embedded Engine): the
// server recovers and the test sees an error result.
type fakeEngine struct {
	Engine
	cfg   *config.Config
	err   error
	calls []string // the methods called, in order

	execReq  apitypes.ExecRequest
	jobReq   apitypes.JobStatusRequest
	listReq  apitypes.FileListRequest
	output   [][2]string // what Exec writes through onOutput
	fileList *apitypes.FileList
	// network, when set, answers SandboxNetwork (elicit_test.go).
	network func(apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error)
	// watches are the live WatchNetwork watches, by sandbox id.
	watches map[string]engine.NetworkWatch
	watchMu sync.Mutex
	// execHook, when set, runs inside Exec and RunCode with the call's
	// context: what the sandbox does meanwhile (elicit_test.go: the DNS
	// forwarder's questions).
	execHook func(ctx context.Context)
}

func newFake() *fakeEngine { return &fakeEngine{cfg: config.Default()} }

// ex is an example T, and the fake's error; it records the call.
func ex[T any](f *fakeEngine, method string) (*T, error) {
	f.calls = append(f.calls, method)
	v := contract.ExampleOf[T]()
	return &v, f.err
}

func (f *fakeEngine) Config() *config.Config { return f.cfg }

func (f *fakeEngine) CreateSandbox(context.Context, apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "CreateSandbox")
}

// CreateSandboxProgress is sandbox_create's call (a VM reports its boot
// and first build through progress).
func (f *fakeEngine) CreateSandboxProgress(context.Context, apitypes.CreateSandboxRequest, func(string)) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "CreateSandboxProgress")
}

// ScreenshotSandbox answers the eight bytes of the PNG signature.
func (f *fakeEngine) ScreenshotSandbox(context.Context, string) ([]byte, error) {
	f.calls = append(f.calls, "ScreenshotSandbox")
	return []byte("\x89PNG\r\n\x1a\n"), f.err
}

func (f *fakeEngine) ListSandboxes(context.Context, string) ([]*apitypes.Sandbox, error) {
	sb, err := ex[apitypes.Sandbox](f, "ListSandboxes")
	return []*apitypes.Sandbox{sb}, err
}

func (f *fakeEngine) GetSandbox(context.Context, string) (*apitypes.SandboxDetail, error) {
	return ex[apitypes.SandboxDetail](f, "GetSandbox")
}

func (f *fakeEngine) TerminateSandbox(context.Context, string) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "TerminateSandbox")
}

func (f *fakeEngine) PauseSandbox(context.Context, string) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "PauseSandbox")
}

func (f *fakeEngine) ResumeSandbox(context.Context, string) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "ResumeSandbox")
}

func (f *fakeEngine) SandboxNetwork(_ context.Context, req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error) {
	if f.network != nil {
		f.calls = append(f.calls, "SandboxNetwork")
		return f.network(req)
	}
	return ex[apitypes.NetworkStatus](f, "SandboxNetwork")
}

// WatchNetwork records the watch in f.watches; the tests call its
// functions as pkg/network's DNS forwarder would.
func (f *fakeEngine) WatchNetwork(_ context.Context, id string, w engine.NetworkWatch) (func(), error) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if f.watches == nil {
		f.watches = map[string]engine.NetworkWatch{}
	}
	f.watches[id] = w
	return func() {
		f.watchMu.Lock()
		defer f.watchMu.Unlock()
		delete(f.watches, id)
	}, nil
}

func (f *fakeEngine) ExposePort(context.Context, apitypes.ExposePortRequest) (*apitypes.PortExposure, error) {
	return ex[apitypes.PortExposure](f, "ExposePort")
}

func (f *fakeEngine) Exec(ctx context.Context, req apitypes.ExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error) {
	f.execReq = req
	if f.execHook != nil {
		f.execHook(ctx)
	}
	for _, o := range f.output {
		if onOutput != nil {
			onOutput(o[0], []byte(o[1]))
		}
	}
	return ex[apitypes.ExecResult](f, "Exec")
}

func (f *fakeEngine) StartJob(_ context.Context, req apitypes.ExecRequest) (string, error) {
	f.execReq = req
	f.calls = append(f.calls, "StartJob")
	return "job-1", f.err
}

func (f *fakeEngine) JobStatus(_ context.Context, req apitypes.JobStatusRequest) (*apitypes.JobStatus, error) {
	f.jobReq = req
	return ex[apitypes.JobStatus](f, "JobStatus")
}

func (f *fakeEngine) KillJob(context.Context, apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	return ex[apitypes.JobKillResult](f, "KillJob")
}

func (f *fakeEngine) RunTask(context.Context, apitypes.RunTaskRequest) (*apitypes.ExecResult, error) {
	return ex[apitypes.ExecResult](f, "RunTask")
}

func (f *fakeEngine) PackagesInstall(context.Context, apitypes.PackagesInstallRequest) (*apitypes.ExecResult, error) {
	return ex[apitypes.ExecResult](f, "PackagesInstall")
}

func (f *fakeEngine) WriteFile(context.Context, apitypes.FileWriteRequest) (*apitypes.FileResult, error) {
	return ex[apitypes.FileResult](f, "WriteFile")
}

func (f *fakeEngine) ReadFile(context.Context, apitypes.FileReadRequest) (*apitypes.FileReadResult, error) {
	return ex[apitypes.FileReadResult](f, "ReadFile")
}

func (f *fakeEngine) ListFilesPage(_ context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	f.listReq = req
	if f.fileList != nil {
		f.calls = append(f.calls, "ListFilesPage")
		return f.fileList, f.err
	}
	return ex[apitypes.FileList](f, "ListFilesPage")
}

func (f *fakeEngine) DeleteFile(context.Context, string, string, bool) (*apitypes.FileResult, error) {
	return ex[apitypes.FileResult](f, "DeleteFile")
}

func (f *fakeEngine) ExportFiles(context.Context, string, string) (*apitypes.Artifact, error) {
	return ex[apitypes.Artifact](f, "ExportFiles")
}

func (f *fakeEngine) SnapshotSandbox(context.Context, apitypes.SnapshotRequest) (*apitypes.Snapshot, error) {
	return ex[apitypes.Snapshot](f, "SnapshotSandbox")
}

func (f *fakeEngine) RestoreSandbox(context.Context, apitypes.RestoreRequest) (*apitypes.Sandbox, error) {
	return ex[apitypes.Sandbox](f, "RestoreSandbox")
}

func (f *fakeEngine) ListSnapshots(context.Context, string) ([]apitypes.Snapshot, error) {
	s, err := ex[apitypes.Snapshot](f, "ListSnapshots")
	return []apitypes.Snapshot{*s}, err
}

func (f *fakeEngine) DeleteSnapshot(context.Context, string) error {
	_, err := ex[struct{}](f, "DeleteSnapshot")
	return err
}

func (f *fakeEngine) CreateTemplate(context.Context, apitypes.TemplateCreateRequest) (*apitypes.Template, error) {
	return ex[apitypes.Template](f, "CreateTemplate")
}

func (f *fakeEngine) ListTemplates(context.Context) (*apitypes.TemplateList, error) {
	return ex[apitypes.TemplateList](f, "ListTemplates")
}

func (f *fakeEngine) GetTemplate(context.Context, string) (*apitypes.Template, error) {
	return ex[apitypes.Template](f, "GetTemplate")
}

func (f *fakeEngine) DeleteTemplate(context.Context, string) error {
	_, err := ex[struct{}](f, "DeleteTemplate")
	return err
}

func (f *fakeEngine) CreateVolume(context.Context, apitypes.VolumeCreateRequest) (*apitypes.Volume, error) {
	return ex[apitypes.Volume](f, "CreateVolume")
}

func (f *fakeEngine) ListVolumes(context.Context) (*apitypes.VolumeList, error) {
	return ex[apitypes.VolumeList](f, "ListVolumes")
}

func (f *fakeEngine) GetVolume(context.Context, string) (*apitypes.Volume, error) {
	return ex[apitypes.Volume](f, "GetVolume")
}

func (f *fakeEngine) DeleteVolume(context.Context, string) error {
	_, err := ex[struct{}](f, "DeleteVolume")
	return err
}

func (f *fakeEngine) RunCode(ctx context.Context, _ apitypes.RunCodeRequest, _ sandbox.OutputFunc) (*apitypes.RunResult, error) {
	if f.execHook != nil {
		f.execHook(ctx)
	}
	return ex[apitypes.RunResult](f, "RunCode")
}

func (f *fakeEngine) ListRuns(context.Context, apitypes.RunFilter) ([]apitypes.RunMetadata, error) {
	m, err := ex[apitypes.RunMetadata](f, "ListRuns")
	return []apitypes.RunMetadata{*m}, err
}

func (f *fakeEngine) GetRun(context.Context, string, int64) (*apitypes.RunRecord, error) {
	return ex[apitypes.RunRecord](f, "GetRun")
}

func (f *fakeEngine) Autofix(context.Context, apitypes.AutofixRequest, engine.AutofixOptions) (*apitypes.AutofixResult, error) {
	return ex[apitypes.AutofixResult](f, "Autofix")
}

func (f *fakeEngine) AutofixSubmit(context.Context, apitypes.AutofixSubmitRequest, engine.AutofixOptions) (*apitypes.AutofixResult, error) {
	return ex[apitypes.AutofixResult](f, "AutofixSubmit")
}

func (f *fakeEngine) AutofixStatus(context.Context, string) (*apitypes.AutofixResult, error) {
	return ex[apitypes.AutofixResult](f, "AutofixStatus")
}

func (f *fakeEngine) AgentRun(context.Context, apitypes.AgentRunRequest, func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error) {
	return ex[apitypes.AgentRunResult](f, "AgentRun")
}

func (f *fakeEngine) KeyUsage(context.Context, string) (*apitypes.KeyUsage, error) {
	return ex[apitypes.KeyUsage](f, "KeyUsage")
}

func (f *fakeEngine) Languages(context.Context) ([]apitypes.LanguageInfo, error) {
	l, err := ex[apitypes.LanguageInfo](f, "Languages")
	return []apitypes.LanguageInfo{*l}, err
}

func (f *fakeEngine) ImageList(context.Context) (*apitypes.ImageList, error) {
	return ex[apitypes.ImageList](f, "ImageList")
}

func (f *fakeEngine) PullImage(_ context.Context, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error) {
	if progress != nil {
		progress(apitypes.ImageProgress{Phase: "resolved", Image: "oci-0123456789ab", Layers: 1})
	}
	return ex[apitypes.Image](f, "PullImage")
}

func (f *fakeEngine) BuildDockerfile(_ context.Context, _ apitypes.DockerfileBuildRequest, _ io.Reader, progress func(apitypes.BuildProgress)) (*apitypes.Image, error) {
	if progress != nil {
		progress(apitypes.BuildProgress{Phase: "step", Step: 1, Steps: 1, Instruction: "FROM shell"})
	}
	return ex[apitypes.Image](f, "BuildDockerfile")
}

func (f *fakeEngine) EnsureImage(context.Context, string, io.Writer) (*apitypes.Image, error) {
	return ex[apitypes.Image](f, "EnsureImage")
}

func (f *fakeEngine) RemoveImage(context.Context, string) error {
	_, err := ex[struct{}](f, "RemoveImage")
	return err
}

// contractCase is one tool of the contract test: arguments that pass its
// input checks, the pkg/apitypes type whose every field its answer must
// carry, and the fields it leaves out on purpose.
type contractCase struct {
	tool   string
	args   map[string]any
	want   reflect.Type
	exempt []string
}

var sb = map[string]any{"sandbox_id": "sb-1"}

func with(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

var contractCases = []contractCase{
	{"sandbox_create", map[string]any{"language": "shell"}, reflect.TypeFor[apitypes.Sandbox](), nil},
	{"sandbox_list", nil, reflect.TypeFor[apitypes.SandboxList](), []string{"truncated"}},
	{"sandbox_get", sb, reflect.TypeFor[apitypes.SandboxDetail](), nil},
	{"sandbox_network", sb, reflect.TypeFor[apitypes.NetworkStatus](), nil},
	{"sandbox_terminate", sb, reflect.TypeFor[apitypes.SandboxState](), nil},
	{"sandbox_pause", sb, reflect.TypeFor[apitypes.SandboxState](), nil},
	{"sandbox_resume", sb, reflect.TypeFor[apitypes.SandboxState](), nil},
	{"sandbox_expose_port", with(sb, "port", 8080), reflect.TypeFor[apitypes.PortExposure](), nil},
	{"sandbox_screenshot", sb, reflect.TypeFor[apitypes.ScreenshotResult](), nil},
	{"languages_list", nil, reflect.TypeFor[apitypes.LanguageList](), nil},
	{"quota_usage", nil, reflect.TypeFor[apitypes.KeyUsage](), nil},
	// A synchronous command's outcome carries every field of the engine's
	// ExecResult (usage and blocked_syscalls too, as SPEC promises) but its
	// job id: the job is gone once it finished.
	{"exec_command", with(sb, "command", "true"), reflect.TypeFor[apitypes.ExecResult](), []string{"job_id"}},
	// network_refusals: only after a call in an allowlist sandbox that was
	// refused a host (elicit_test.go; test/mcp TestNetworkApproval).
	{"exec_command", with(sb, "command", "true"), reflect.TypeFor[apitypes.CommandResult](), []string{"job_id", "note", "network_refusals"}},
	{"run_task", with(sb, "task", "test"), reflect.TypeFor[apitypes.ExecResult](), []string{"job_id"}},
	{"packages_install", with(sb, "manager", "pip", "packages", []string{"x"}), reflect.TypeFor[apitypes.ExecResult](), []string{"job_id"}},
	{"job_status", with(sb, "job_id", "j-1"), reflect.TypeFor[apitypes.JobStatus](), nil},
	{"job_kill", with(sb, "job_id", "j-1"), reflect.TypeFor[apitypes.JobKillResult](), nil},
	{"file_write", with(sb, "path", "/workspace/a", "content", "x"), reflect.TypeFor[apitypes.FileResult](), nil},
	{"file_read", with(sb, "path", "/workspace/a"), reflect.TypeFor[apitypes.FileReadResult](), nil},
	{"file_list", sb, reflect.TypeFor[apitypes.FileList](), nil},
	{"file_delete", with(sb, "path", "/workspace/a"), reflect.TypeFor[apitypes.FileResult](), nil},
	{"files_export", sb, reflect.TypeFor[apitypes.Artifact](), nil},
	{"sandbox_snapshot", sb, reflect.TypeFor[apitypes.Snapshot](), nil},
	{"sandbox_restore", with(sb, "snapshot_id", "snap-1"), reflect.TypeFor[apitypes.SandboxState](), nil},
	{"snapshot_list", nil, reflect.TypeFor[apitypes.SnapshotList](), nil},
	{"snapshot_delete", map[string]any{"snapshot_id": "snap-1"}, reflect.TypeFor[apitypes.SnapshotDeleteResult](), nil},
	{"volume_create", map[string]any{"name": "v"}, reflect.TypeFor[apitypes.Volume](), nil},
	{"template_create", map[string]any{"name": "t", "image": "python"}, reflect.TypeFor[apitypes.Template](), nil},
	{"template_list", nil, reflect.TypeFor[apitypes.TemplateList](), nil},
	{"template_get", map[string]any{"name": "t"}, reflect.TypeFor[apitypes.Template](), nil},
	{"template_delete", map[string]any{"name": "t"}, reflect.TypeFor[apitypes.TemplateDeleteResult](), nil},
	{"volume_list", nil, reflect.TypeFor[apitypes.VolumeList](), nil},
	{"volume_get", map[string]any{"name": "v"}, reflect.TypeFor[apitypes.Volume](), nil},
	{"volume_delete", map[string]any{"name": "v"}, reflect.TypeFor[apitypes.VolumeDeleteResult](), nil},
	// run_code spends the budget once: the last step's output is the top
	// level's, so the last step carries none (its fields stay, empty).
	{"run_code", map[string]any{"language": "python", "code": "print(1)"}, reflect.TypeFor[apitypes.RunResult](), []string{"note", "network_refusals"}},
	{"run_get", map[string]any{"run_id": "r-1"}, reflect.TypeFor[apitypes.RunRecord](), []string{"note"}},
	{"run_list", nil, reflect.TypeFor[apitypes.RunList](), []string{"truncated"}},
	{"image_list", nil, reflect.TypeFor[apitypes.ImageList](), []string{"note"}},
	{"image_build", map[string]any{"name": "python"}, reflect.TypeFor[apitypes.Image](), nil},
	{"image_pull", map[string]any{"reference": "registry.example:5000/team/python:3"}, reflect.TypeFor[apitypes.Image](), nil},
	{"image_build_dockerfile", map[string]any{"dockerfile": "FROM shell\n"}, reflect.TypeFor[apitypes.Image](), nil},
	{"image_delete", map[string]any{"name": "python"}, reflect.TypeFor[apitypes.ImageDeleteResult](), nil},
	{"autofix", map[string]any{"language": "python", "code": "print(1)"}, reflect.TypeFor[apitypes.AutofixResult](), []string{"note", "last_result.note", "last_result.network_refusals"}},
	{"autofix_status", map[string]any{"autofix_id": "af-1"}, reflect.TypeFor[apitypes.AutofixResult](), []string{"note", "last_result.note", "last_result.network_refusals"}},
	{"autofix_submit", map[string]any{"autofix_id": "af-1", "code": "print(2)"}, reflect.TypeFor[apitypes.AutofixResult](), []string{"note", "last_result.note", "last_result.network_refusals"}},
	{"agent_run", map[string]any{"prompt": "p"}, reflect.TypeFor[apitypes.AgentRunResult](), nil},
}

// TestContract is the MCP half of the contract check. For every tool:
// its output type is declared in pkg/apitypes (MCP outputs ARE the
// contract's types), its output schema names every field of that type, and
// — against a fake engine whose answers have every field set — its
// structured content carries every field (recursively) of the contract
// type the case names. It fails when a tool drops or renames a field,
// whether in its own copy of a type or in the code that fills it.
func TestContract(t *testing.T) {
	f := newFake()
	s := newSrv(f, Options{Log: nil})
	c := newClient(t, f, Options{})
	tools, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, cc := range contractCases {
		covered[cc.tool] = true
	}
	for _, tool := range tools.Tools {
		// vm_test's outcome embeds apitypes.VMTestResult and moves its
		// screenshot to an image content block (vmTestOut, tools_vm.go);
		// it needs a booted guest, so its fields are not checked here.
		if tool.Name == "vm_test" {
			continue
		}
		out, ok := s.outputs[tool.Name]
		if !ok {
			t.Errorf("%s: no output type recorded", tool.Name)
			continue
		}
		if out.PkgPath() != reflect.TypeFor[apitypes.Sandbox]().PkgPath() {
			t.Errorf("%s: output type %s is not declared in pkg/apitypes", tool.Name, out)
		}
		if !covered[tool.Name] {
			t.Errorf("%s: not in contractCases: add it", tool.Name)
		}
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		raw, _ := json.Marshal(tool.OutputSchema)
		if len(tool.RawOutputSchema) > 0 {
			raw = tool.RawOutputSchema
		}
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatalf("%s: output schema %s: %v", tool.Name, raw, err)
		}
		for _, fl := range contract.Fields(out) {
			if _, ok := schema.Properties[fl.Name]; !ok {
				t.Errorf("%s: output schema lacks %s (%s.%s)", tool.Name, fl.Name, out, fl.GoName)
			}
		}
	}
	for _, cc := range contractCases {
		t.Run(cc.tool+"/"+cc.want.Name(), func(t *testing.T) {
			res := c.call(cc.tool, cc.args, nil)
			if res.IsError {
				t.Fatalf("error result %s", text(res))
			}
			b, _ := json.Marshal(res.StructuredContent)
			var got any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			var miss []string
			for _, m := range contract.Missing(cc.want, got) {
				if !contains(cc.exempt, m) {
					miss = append(miss, m)
				}
			}
			if len(miss) > 0 {
				t.Errorf("%s answers %s\nwithout %v of %s", cc.tool, b, miss, cc.want)
			}
		})
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestFakeExecBackground: with background the answer is the job id and
// state running, no exit code; the engine got the contract's request.
func TestFakeExecBackground(t *testing.T) {
	f := newFake()
	c := newClient(t, f, Options{})
	r := ok[execOut](c, "exec_command", with(sb, "command", "sleep 9", "background", true, "env", map[string]string{"A": "1"}))
	if r.JobID != "job-1" || r.State != apitypes.JobRunning || r.ExitCode != nil || r.Termination != nil {
		t.Errorf("background answer %+v", r)
	}
	if f.execReq.SandboxID != "sb-1" || f.execReq.Command != "sleep 9" || f.execReq.Env["A"] != "1" {
		t.Errorf("engine got %+v", f.execReq)
	}
}

// TestFakeFileListTotals: file_list hands the engine's total and truncated
// on, and asks for as many entries as the result can hold (the result's
// size cuts the list, not a count).
func TestFakeFileListTotals(t *testing.T) {
	f := newFake()
	f.fileList = &apitypes.FileList{Entries: []apitypes.FileEntry{{Path: "/workspace/a", Type: "file"}}, Total: 100_500, Truncated: true}
	c := newClient(t, f, Options{})
	l := ok[fileListOut](c, "file_list", with(sb, "recursive", true))
	if l.Total != 100_500 || !l.Truncated || len(l.Entries) != 1 {
		t.Errorf("file_list = %+v", l)
	}
	if f.listReq.MaxEntries != engine.MaxListEntries || !f.listReq.Recursive || f.listReq.SandboxID != "sb-1" {
		t.Errorf("engine got %+v", f.listReq)
	}
}

// TestFakeJobStatusPage: job_status asks the engine for a page that fits
// the result budget, and hands its paging (offsets, more) on unchanged.
func TestFakeJobStatusPage(t *testing.T) {
	f := newFake()
	c := newClient(t, f, Options{MaxResultBytes: 20 << 10})
	st := ok[jobStatusOut](c, "job_status", with(sb, "job_id", "j-1", "stdout_offset", 7, "stderr_offset", 9))
	if f.jobReq.StdoutOffset != 7 || f.jobReq.StderrOffset != 9 || f.jobReq.MaxBytes != (20<<10)/5 {
		t.Errorf("engine got %+v", f.jobReq)
	}
	if !st.More || st.NextStdoutOffset != 1 {
		t.Errorf("job_status = %+v", st)
	}
}

// TestFakeDecodeErrors: arguments are checked against the input type
// before the engine is called, and the message names the field in JSON
// terms, worded as REST words it (apitypes.DecodeError).
func TestFakeDecodeErrors(t *testing.T) {
	f := newFake()
	c := newClient(t, f, Options{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"exec_command", map[string]any{"command": "true"}, "sandbox_id: required"},
		{"exec_command", with(sb, "command", "true", "colour", "red"), `arguments: unknown field "colour"`},
		{"exec_command", with(sb, "timeout_seconds", "soon"), "timeout_seconds: want a number, got JSON string"},
		{"file_list", with(sb, "recursive", "yes"), "recursive: want a boolean, got JSON string"},
		{"packages_install", with(sb, "manager", "pip", "packages", "x"), "packages: want an array of string, got JSON string"},
		{"sandbox_create", map[string]any{"memory_mb": 1.5}, "memory_mb: want an integer, got JSON number 1.5"},
	} {
		code, msg := errCode(t, c.call(tc.tool, tc.args, nil))
		if code != string(errdefs.InvalidArgument) || msg != tc.want {
			t.Errorf("%s %v: %s %q, want invalid_argument %q", tc.tool, tc.args, code, msg, tc.want)
		}
	}
	if len(f.calls) != 0 {
		t.Errorf("refused arguments reached the engine: %v", f.calls)
	}
}

// TestFakeErrorResults: the engine's errors become isError results with
// the one error body; an error of no class says "internal error" only.
func TestFakeErrorResults(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code errdefs.Code
		msg  string
	}{
		{errdefs.NotFoundf("sandbox sb-1: not found"), errdefs.NotFound, "sandbox sb-1: not found"},
		{errdefs.Unavailablef("sandbox sb-1: no exec"), errdefs.Unavailable, "sandbox sb-1: no exec"},
		{errors.New("secret host path /var/lib/x"), errdefs.Internal, "internal error"},
	} {
		f := newFake()
		f.err = tc.err
		c := newClient(t, f, Options{})
		code, msg := errCode(t, c.call("sandbox_get", sb, nil))
		if code != string(tc.code) || msg != tc.msg {
			t.Errorf("engine error %v: %s %q, want %s %q", tc.err, code, msg, tc.code, tc.msg)
		}
	}
}
