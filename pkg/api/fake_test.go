package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/internal/contract"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// fakeEngine answers the REST API's engine calls from memory, so that the
// handlers' decode and encode tests run as any user: no root, no images.
// Each method records the request it was given and answers an example
// value with every field set (contract.Example), or err when set. A
// method the tests do not need panics (the nil embedded Engine), which
// the handler's test then reports.
type fakeEngine struct {
	Engine
	err error // answered by every method when set

	// What the handlers passed.
	listReq  apitypes.FileListRequest
	jobReq   apitypes.JobStatusRequest
	create   apitypes.CreateSandboxRequest
	execReq  apitypes.ExecRequest
	taskReq  apitypes.RunTaskRequest
	pkgReq   apitypes.PackagesInstallRequest
	output   [][2]string // what Exec writes through onOutput: stream, data
	metrics  *prometheus.Registry
	fileList *apitypes.FileList
	who      principal.Principal // of the last ListSandboxes or NodeStatus
}

func ex[T any]() *T { v := contract.ExampleOf[T](); return &v }

func (f *fakeEngine) CreateKey(context.Context, apitypes.KeyCreateRequest) (*apitypes.KeySecret, error) {
	return ex[apitypes.KeySecret](), f.err
}
func (f *fakeEngine) ListKeys(context.Context) ([]apitypes.Key, error) {
	return []apitypes.Key{*ex[apitypes.Key]()}, f.err
}
func (f *fakeEngine) RevokeKey(context.Context, string) (*apitypes.Key, error) {
	return ex[apitypes.Key](), f.err
}
func (f *fakeEngine) RotateKey(context.Context, string) (*apitypes.KeySecret, error) {
	return ex[apitypes.KeySecret](), f.err
}
func (f *fakeEngine) KeyUsage(context.Context, string) (*apitypes.KeyUsage, error) {
	return ex[apitypes.KeyUsage](), f.err
}

func (f *fakeEngine) CreateSandbox(_ context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error) {
	f.create = req
	return ex[apitypes.Sandbox](), f.err
}

func (f *fakeEngine) ListSandboxes(ctx context.Context, _ string) ([]*apitypes.Sandbox, error) {
	f.who, _ = principal.From(ctx)
	return []*apitypes.Sandbox{ex[apitypes.Sandbox]()}, f.err
}

func (f *fakeEngine) SSHEndpoint(context.Context) (*apitypes.SSHEndpoint, error) {
	return ex[apitypes.SSHEndpoint](), f.err
}

func (f *fakeEngine) SSHKeyList(context.Context) (*apitypes.SSHKeyList, error) {
	return ex[apitypes.SSHKeyList](), f.err
}

func (f *fakeEngine) SSHKeyAdd(context.Context, apitypes.SSHKeyAddRequest) (*apitypes.SSHKey, error) {
	return ex[apitypes.SSHKey](), f.err
}

func (f *fakeEngine) SSHToken(_ context.Context, req apitypes.SSHTokenRequest) (*apitypes.SSHToken, error) {
	t := ex[apitypes.SSHToken]()
	t.User = req.SandboxID
	return t, f.err
}

func (f *fakeEngine) GetSandbox(context.Context, string) (*apitypes.SandboxDetail, error) {
	return ex[apitypes.SandboxDetail](), f.err
}

func (f *fakeEngine) ListFilesPage(_ context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	f.listReq = req
	if f.fileList != nil {
		return f.fileList, f.err
	}
	return ex[apitypes.FileList](), f.err
}

func (f *fakeEngine) JobStatus(_ context.Context, req apitypes.JobStatusRequest) (*apitypes.JobStatus, error) {
	f.jobReq = req
	return ex[apitypes.JobStatus](), f.err
}

func (f *fakeEngine) ListJobs(context.Context, string) ([]apitypes.JobInfo, error) {
	return []apitypes.JobInfo{*ex[apitypes.JobInfo]()}, f.err
}

func (f *fakeEngine) Exec(_ context.Context, req apitypes.ExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error) {
	f.execReq = req
	for _, o := range f.output {
		onOutput(o[0], []byte(o[1]))
	}
	return ex[apitypes.ExecResult](), f.err
}

func (f *fakeEngine) Languages(context.Context) ([]apitypes.LanguageInfo, error) {
	return []apitypes.LanguageInfo{*ex[apitypes.LanguageInfo]()}, f.err
}

func (f *fakeEngine) ListRuns(context.Context, apitypes.RunFilter) ([]apitypes.RunMetadata, error) {
	return []apitypes.RunMetadata{*ex[apitypes.RunMetadata]()}, f.err
}

func (f *fakeEngine) ListSnapshots(context.Context, string) ([]apitypes.Snapshot, error) {
	return []apitypes.Snapshot{*ex[apitypes.Snapshot]()}, f.err
}

func (f *fakeEngine) CreateTemplate(context.Context, apitypes.TemplateCreateRequest) (*apitypes.Template, error) {
	return ex[apitypes.Template](), f.err
}

func (f *fakeEngine) ListTemplates(context.Context) (*apitypes.TemplateList, error) {
	return ex[apitypes.TemplateList](), f.err
}

func (f *fakeEngine) GetTemplate(context.Context, string) (*apitypes.Template, error) {
	return ex[apitypes.Template](), f.err
}

func (f *fakeEngine) CreateVolume(context.Context, apitypes.VolumeCreateRequest) (*apitypes.Volume, error) {
	return ex[apitypes.Volume](), f.err
}

func (f *fakeEngine) ListVolumes(context.Context) (*apitypes.VolumeList, error) {
	return ex[apitypes.VolumeList](), f.err
}

func (f *fakeEngine) GetVolume(context.Context, string) (*apitypes.Volume, error) {
	return ex[apitypes.Volume](), f.err
}

func (f *fakeEngine) Ports(context.Context, string) ([]apitypes.PortExposure, error) {
	return []apitypes.PortExposure{*ex[apitypes.PortExposure]()}, f.err
}

func (f *fakeEngine) KillJob(context.Context, apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	return ex[apitypes.JobKillResult](), f.err
}

func (f *fakeEngine) Status(context.Context) (*apitypes.Status, error) {
	return ex[apitypes.Status](), f.err
}

func (f *fakeEngine) NodeStatus(ctx context.Context) (*apitypes.NodeStatus, error) {
	f.who, _ = principal.From(ctx)
	return ex[apitypes.NodeStatus](), f.err
}

func (f *fakeEngine) SetDraining(context.Context, bool) (*apitypes.NodeStatus, error) {
	return ex[apitypes.NodeStatus](), f.err
}

func (f *fakeEngine) ImageList(context.Context) (*apitypes.ImageList, error) {
	return ex[apitypes.ImageList](), f.err
}

func (f *fakeEngine) RunTask(_ context.Context, req apitypes.RunTaskRequest) (*apitypes.ExecResult, error) {
	f.taskReq = req
	return ex[apitypes.ExecResult](), f.err
}

func (f *fakeEngine) PackagesInstall(_ context.Context, req apitypes.PackagesInstallRequest) (*apitypes.ExecResult, error) {
	f.pkgReq = req
	return ex[apitypes.ExecResult](), f.err
}

func (f *fakeEngine) StartJob(_ context.Context, req apitypes.ExecRequest) (string, error) {
	f.execReq = req
	return "job-1", f.err
}

func (f *fakeEngine) Uptime() time.Duration { return time.Second }

func (f *fakeEngine) GC(context.Context) (*apitypes.GCReport, error) {
	return ex[apitypes.GCReport](), f.err
}

// SubscribeEvents sends nothing and ends with ctx, as a quiet daemon's.
func (f *fakeEngine) SubscribeEvents(ctx context.Context, _ string) <-chan apitypes.Event {
	ch := make(chan apitypes.Event)
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch
}

func (f *fakeEngine) MetricsRegistry() *prometheus.Registry {
	if f.metrics == nil {
		f.metrics = prometheus.NewRegistry()
	}
	return f.metrics
}

// newFakeServer serves the REST API over f on the loopback, without a
// token (as on the unix socket).
func newFakeServer(t *testing.T, f *fakeEngine) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(NewHandler(f, Options{}))
	t.Cleanup(hs.Close)
	return hs
}

// do sends a request and returns the status and the body.
func do(t *testing.T, hs *httptest.Server, method, path, body string) (int, []byte) {
	t.Helper()
	resp, b := doAs(t, hs, "", method, path, body)
	return resp.StatusCode, b
}

// doAs sends a request with bearer key (none if empty) and returns the
// response, its body read and closed, and the body.
func doAs(t *testing.T, hs *httptest.Server, key, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestFakeContract is the REST half of the contract check: every route
// below answers JSON that carries every field (recursively) of its
// pkg/apitypes type, as the engine filled it. It fails when a handler
// serves its own copy of a type that drops or renames a field.
func TestFakeContract(t *testing.T) {
	hs := newFakeServer(t, &fakeEngine{})
	for _, tc := range []struct {
		method, path, body string
		want               reflect.Type
	}{
		{"GET", "/v1/sandboxes", "", reflect.TypeFor[apitypes.SandboxList]()},
		{"GET", "/v1/sandboxes/sb-1", "", reflect.TypeFor[apitypes.SandboxDetail]()},
		{"POST", "/v1/sandboxes", `{"language":"shell"}`, reflect.TypeFor[apitypes.Sandbox]()},
		{"GET", "/v1/sandboxes/sb-1/files?list=true", "", reflect.TypeFor[apitypes.FileList]()},
		{"GET", "/v1/sandboxes/sb-1/jobs", "", reflect.TypeFor[apitypes.JobList]()},
		{"GET", "/v1/sandboxes/sb-1/jobs/j-1", "", reflect.TypeFor[apitypes.JobStatus]()},
		{"DELETE", "/v1/sandboxes/sb-1/jobs/j-1", "", reflect.TypeFor[apitypes.JobKillResult]()},
		{"POST", "/v1/sandboxes/sb-1/jobs", `{"command":"true"}`, reflect.TypeFor[apitypes.JobStarted]()},
		{"POST", "/v1/sandboxes/sb-1/tasks", `{"task":"test"}`, reflect.TypeFor[apitypes.ExecResult]()},
		{"POST", "/v1/sandboxes/sb-1/packages", `{"manager":"pip","packages":["six"]}`, reflect.TypeFor[apitypes.ExecResult]()},
		{"GET", "/v1/sandboxes/sb-1/ports", "", reflect.TypeFor[apitypes.PortList]()},
		{"GET", "/v1/ssh", "", reflect.TypeFor[apitypes.SSHEndpoint]()},
		{"GET", "/v1/ssh/keys", "", reflect.TypeFor[apitypes.SSHKeyList]()},
		{"POST", "/v1/ssh/keys", `{"name":"laptop","public_key":"ssh-ed25519 AAAA"}`, reflect.TypeFor[apitypes.SSHKey]()},
		{"POST", "/v1/sandboxes/sb-1/ssh-token", `{}`, reflect.TypeFor[apitypes.SSHToken]()},
		{"GET", "/v1/languages", "", reflect.TypeFor[apitypes.LanguageList]()},
		{"GET", "/v1/runs", "", reflect.TypeFor[apitypes.RunList]()},
		{"GET", "/v1/snapshots", "", reflect.TypeFor[apitypes.SnapshotList]()},
		{"GET", "/v1/keys", "", reflect.TypeFor[apitypes.KeyList]()},
		{"POST", "/v1/keys", `{"name":"k"}`, reflect.TypeFor[apitypes.KeySecret]()},
		{"POST", "/v1/keys/key-1/rotate", "", reflect.TypeFor[apitypes.KeySecret]()},
		{"POST", "/v1/keys/key-1/revoke", "", reflect.TypeFor[apitypes.Key]()},
		{"GET", "/v1/keys/self/usage", "", reflect.TypeFor[apitypes.KeyUsage]()},
		{"GET", "/v1/volumes", "", reflect.TypeFor[apitypes.VolumeList]()},
		{"GET", "/v1/templates", "", reflect.TypeFor[apitypes.TemplateList]()},
		{"GET", "/v1/templates/t", "", reflect.TypeFor[apitypes.Template]()},
		{"POST", "/v1/templates", `{"name":"t","image":"python"}`, reflect.TypeFor[apitypes.Template]()},
		{"GET", "/v1/volumes/v", "", reflect.TypeFor[apitypes.Volume]()},
		{"POST", "/v1/volumes", `{"name":"v"}`, reflect.TypeFor[apitypes.Volume]()},
		{"GET", "/v1/status", "", reflect.TypeFor[apitypes.Status]()},
		{"GET", "/v1/images", "", reflect.TypeFor[apitypes.ImageList]()},
		{"GET", "/v1/system", "", reflect.TypeFor[apitypes.SystemInfo]()},
		{"GET", "/healthz", "", reflect.TypeFor[apitypes.Health]()},
		{"GET", "/v1/nowhere", "", reflect.TypeFor[apitypes.ErrorResponse]()},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			_, body := do(t, hs, tc.method, tc.path, tc.body)
			var got any
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			// What only a front end that cuts its answers writes (MCP's
			// note; truncated of a list REST never cuts) is optional here.
			var miss []string
			for _, m := range contract.Missing(tc.want, got) {
				if m != "note" && !strings.HasSuffix(m, ".note") && m != "truncated" {
					miss = append(miss, m)
				}
			}
			if len(miss) > 0 {
				t.Errorf("%s %s answers %s\nwithout %v of %s", tc.method, tc.path, body, miss, tc.want)
			}
		})
	}
}

// TestFakeFileListPaging: ?max_entries= reaches the engine, and the list
// says how long it is and that it was cut — what a client needs to tell
// an incomplete list (the 100,500 entries) from a complete one.
func TestFakeFileListPaging(t *testing.T) {
	f := &fakeEngine{fileList: &apitypes.FileList{Entries: []apitypes.FileEntry{{Path: "/workspace/a", Type: "file"}}, Total: 100_500, Truncated: true}}
	hs := newFakeServer(t, f)
	st, body := do(t, hs, "GET", "/v1/sandboxes/sb-1/files?list=true&path=/workspace&recursive=true&max_entries=1", "")
	if st != http.StatusOK {
		t.Fatalf("status %d: %s", st, body)
	}
	want := apitypes.FileListRequest{SandboxID: "sb-1", Path: "/workspace", Recursive: true, MaxEntries: 1}
	if f.listReq != want {
		t.Errorf("engine got %+v, want %+v", f.listReq, want)
	}
	var l apitypes.FileList
	if err := json.Unmarshal(body, &l); err != nil || l.Total != 100_500 || !l.Truncated || len(l.Entries) != 1 {
		t.Errorf("list = %s (%v)", body, err)
	}
	st, body = do(t, hs, "GET", "/v1/sandboxes/sb-1/files?list=true&max_entries=many", "")
	if st != http.StatusBadRequest || !strings.Contains(string(body), "max_entries") {
		t.Errorf("max_entries=many: %d %s, want 400 naming max_entries", st, body)
	}
}

// TestFakeJobStatusQuery: the job status route hands its query to the
// engine as the contract's request, and refuses a bad offset by name.
func TestFakeJobStatusQuery(t *testing.T) {
	f := &fakeEngine{}
	hs := newFakeServer(t, f)
	if st, body := do(t, hs, "GET", "/v1/sandboxes/sb-1/jobs/j-1?stdout_offset=10&stderr_offset=20&max_bytes=30", ""); st != http.StatusOK {
		t.Fatalf("status %d: %s", st, body)
	}
	want := apitypes.JobStatusRequest{SandboxID: "sb-1", JobID: "j-1", StdoutOffset: 10, StderrOffset: 20, MaxBytes: 30}
	if f.jobReq != want {
		t.Errorf("engine got %+v, want %+v", f.jobReq, want)
	}
	if st, body := do(t, hs, "GET", "/v1/sandboxes/sb-1/jobs/j-1?stdout_offset=-x", ""); st != http.StatusBadRequest || !strings.Contains(string(body), "stdout_offset") {
		t.Errorf("bad offset: %d %s", st, body)
	}
}

// TestFakeErrors: the engine's error codes become the one status table's
// statuses and the one error body; an error of no class is a 500 that
// says "internal error" and nothing of its cause.
func TestFakeErrors(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
		msg    string
	}{
		{errdefs.NotFoundf("sandbox sb-1: not found"), 404, "not_found", "sandbox sb-1: not found"},
		{errdefs.Conflictf("sandbox sb-1 is terminated"), 409, "conflict", "sandbox sb-1 is terminated"},
		{errdefs.LimitExceededf("too many"), 429, "limit_exceeded", "too many"},
		{errdefs.Unavailablef("no network"), 503, "unavailable", "no network"},
		{errors.New("secret host path /var/lib/x"), 500, "internal", "internal error"},
	} {
		hs := newFakeServer(t, &fakeEngine{err: tc.err})
		st, body := do(t, hs, "GET", "/v1/sandboxes/sb-1", "")
		var e apitypes.ErrorResponse
		if err := json.Unmarshal(body, &e); err != nil || st != tc.status || e.Error.Code != tc.code || e.Error.Message != tc.msg {
			t.Errorf("engine error %v: %d %s, want %d %s %q", tc.err, st, body, tc.status, tc.code, tc.msg)
		}
	}
}

// TestFakeCreateDecode: a create body reaches the engine as the contract's
// request; an unknown field or a wrong type is refused by name before the
// engine is called.
func TestFakeCreateDecode(t *testing.T) {
	f := &fakeEngine{}
	hs := newFakeServer(t, f)
	if st, body := do(t, hs, "POST", "/v1/sandboxes", `{"language":"python","memory_mb":64,"labels":{"a":"b"}}`); st != http.StatusCreated {
		t.Fatalf("create: %d %s", st, body)
	}
	if f.create.Language != "python" || f.create.MemoryMB == nil || *f.create.MemoryMB != 64 || f.create.Labels["a"] != "b" {
		t.Errorf("engine got %+v", f.create)
	}
	for body, want := range map[string]string{
		`{"language":"python","colour":"red"}`: `unknown field \"colour\"`,
		`{"memory_mb":"lots"}`:                 "memory_mb: want an integer",
		`{"language":`:                         "truncated JSON",
	} {
		f.create = apitypes.CreateSandboxRequest{}
		st, got := do(t, hs, "POST", "/v1/sandboxes", body)
		if st != http.StatusBadRequest || !strings.Contains(string(got), want) || !strings.Contains(string(got), "invalid_argument") {
			t.Errorf("%s: %d %s, want 400 invalid_argument with %q", body, st, got, want)
		}
		if f.create.Language != "" {
			t.Errorf("%s reached the engine", body)
		}
	}
}

// TestFakeExecStream: the exec stream's lines are the contract's ExecLine:
// output (a split UTF-8 character joined, bytes that are not UTF-8 as
// base64), then the outcome with usage and blocked_syscalls and without
// the output that went out already.
func TestFakeExecStream(t *testing.T) {
	f := &fakeEngine{output: [][2]string{{"stdout", "h\xc3"}, {"stdout", "\xa9llo"}, {"stderr", "\xff\xfe"}}}
	hs := newFakeServer(t, f)
	st, body := do(t, hs, "POST", "/v1/sandboxes/sb-1/exec", `{"argv":["echo","héllo"]}`)
	if st != http.StatusOK {
		t.Fatalf("exec: %d %s", st, body)
	}
	if f.execReq.SandboxID != "sb-1" || len(f.execReq.Argv) != 2 {
		t.Errorf("engine got %+v", f.execReq)
	}
	var lines []apitypes.ExecLine
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	for dec.More() {
		var l apitypes.ExecLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		lines = append(lines, l)
	}
	// The character split between two chunks goes out whole, in the
	// second line.
	if len(lines) != 4 || lines[0].Data != "h" || lines[1].Data != "éllo" || lines[2].Stream != "stderr" ||
		lines[2].Encoding != apitypes.EncodingBase64 || lines[2].Data != "//4=" {
		t.Fatalf("output lines: %s", body)
	}
	exit := lines[3].Exit
	if exit == nil || exit.ExecResult == nil || exit.Usage == nil || len(exit.BlockedSyscalls) != 1 {
		t.Fatalf("exit line: %s", body)
	}
	// The output went out in the lines before: the exit line has none.
	last := strings.TrimSpace(string(body))
	last = last[strings.LastIndex(last, "\n")+1:]
	if strings.Contains(last, `"stdout"`) || strings.Contains(last, `"stderr"`) {
		t.Errorf("exit line carries the output again: %s", last)
	}
}
