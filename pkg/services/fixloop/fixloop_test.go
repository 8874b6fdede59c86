package fixloop

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// fakeSandboxes stands for the sandbox manager and the engine's lifecycle:
// sandboxes whose /workspace is a map, and a python3 that succeeds when
// main.py says "fixed" and otherwise fails with a NameError. The state
// database and the run records are real (SQLite in a temporary directory),
// as is the pipeline the loops drive.
type fakeSandboxes struct {
	n          int
	boxes      map[string]*sandbox.Info
	files      map[string]map[string]string
	created    []apitypes.CreateSandboxRequest
	terminated []string
	events     []apitypes.AutofixEvent
}

func (f *fakeSandboxes) Get(_ context.Context, id string) (*sandbox.Info, error) {
	if b, ok := f.boxes[id]; ok {
		c := *b
		return &c, nil
	}
	return nil, errdefs.NotFoundf("sandbox %s not found", id)
}

func (f *fakeSandboxes) Exec(_ context.Context, id string, spec sandbox.ExecSpec, out sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	res := &sandbox.ExecResult{Termination: sandbox.Termination{Cause: sandbox.CauseExited}}
	if strings.Contains(f.files[id]["/workspace/main.py"], "fixed") {
		res.Stdout = "ok\n"
	} else {
		res.ExitCode, res.Stderr = 1, "NameError: name 'undefined_name' is not defined\n"
	}
	if out != nil {
		out("stdout", []byte(res.Stdout))
		out("stderr", []byte(res.Stderr))
	}
	return res, nil
}

func (f *fakeSandboxes) WriteFile(_ context.Context, id string, req agent.WriteFileRequest, content io.Reader) (*agent.FileInfo, error) {
	b, err := io.ReadAll(content)
	if err != nil {
		return nil, err
	}
	f.files[id][req.Path] = string(b)
	return &agent.FileInfo{Path: req.Path}, nil
}

func (f *fakeSandboxes) ReadFile(context.Context, string, string, int64, int64) (*agent.FileData, error) {
	return nil, errdefs.NotFoundf("path: not found")
}

func (f *fakeSandboxes) ListFiles(_ context.Context, _, dir string, _ bool) ([]agent.FileInfo, error) {
	return nil, errdefs.NotFoundf("path: %s does not exist", dir)
}

func (f *fakeSandboxes) DeleteFile(_ context.Context, id, path string, _ bool) error {
	delete(f.files[id], path)
	return nil
}

// Visible: the tests call as the administrator, who sees every sandbox.
func (f *fakeSandboxes) Visible(context.Context, string) bool { return true }

func (f *fakeSandboxes) PublishAutofix(_ string, ev apitypes.AutofixEvent) {
	f.events = append(f.events, ev)
}

func (f *fakeSandboxes) CreateSandbox(_ context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	f.created = append(f.created, req)
	f.n++
	id := "sb-" + string(rune('a'+f.n))
	f.boxes[id] = &sandbox.Info{ID: id, Image: req.Language, Language: req.Language, State: sandbox.StateReady, Network: req.Network}
	f.files[id] = map[string]string{}
	return f.boxes[id], nil
}

func (f *fakeSandboxes) CreateRunVM(ctx context.Context, _ string, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	return f.CreateSandbox(ctx, req)
}

func (f *fakeSandboxes) TerminateSandbox(_ context.Context, id string) (*sandbox.Info, error) {
	b, ok := f.boxes[id]
	if !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	f.terminated = append(f.terminated, id)
	b.State = sandbox.StateTerminated
	return b, nil
}

func (f *fakeSandboxes) NetworkMode(_, mode string) (string, error) {
	if mode == "" {
		return "none", nil
	}
	return mode, nil
}

type noMetrics struct{}

func (noMetrics) Exec(*sandbox.ExecResult) {}
func (noMetrics) Run(string, string)       {}

func newLoops(t *testing.T) (*Service, *fakeSandboxes, *prometheus.Registry) {
	t.Helper()
	recipes, err := image.LoadRecipes("../../../rootfs")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db, err := store.Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	f := &fakeSandboxes{boxes: map[string]*sandbox.Info{}, files: map[string]map[string]string{}}
	catalog := lang.NewCatalog(recipes, []string{"python"})
	p := pipeline.New(pipeline.Options{Sandboxes: f, Lifecycle: f, Catalog: catalog, Store: db, StateDir: dir,
		ExecTimeout: time.Minute, MaxExecTimeout: time.Hour, Metrics: noMetrics{}})
	reg := prometheus.NewRegistry()
	cfg := config.Default().Autofix
	s := New(Options{Pipeline: p, Sandboxes: f, Lifecycle: f, Store: db, Catalog: catalog, Config: &cfg,
		Registerer: reg})
	return s, f, reg
}

// The client provider's loop, through the service alone: the failing run
// parks at needs_fix with a prompt naming the error, the client's fix runs
// in the same sandbox, the loop ends fixed, its sandbox is removed, its
// record and the corrections export say what happened.
func TestClientLoop(t *testing.T) {
	s, f, reg := newLoops(t)
	ctx := context.Background()
	res, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Code: "print(undefined_name)\n", Provider: apitypes.ProviderClient}, CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != apitypes.AutofixNeedsFix || !strings.Contains(res.Prompt, "NameError") || res.ExpiresAt == nil || res.Attempts != 1 {
		t.Fatalf("first answer %+v", res)
	}
	if len(f.created) != 1 || f.created[0].Labels["sandboxd.autofix"] != res.AutofixID || res.SandboxID == "" || len(f.terminated) != 0 {
		t.Fatalf("created %+v terminated %v (result sandbox %s)", f.created, f.terminated, res.SandboxID)
	}
	st, err := s.AutofixStatus(ctx, res.AutofixID)
	if err != nil || st.Status != apitypes.AutofixNeedsFix {
		t.Fatalf("status %+v, %v", st, err)
	}
	done, err := s.AutofixSubmit(ctx, apitypes.AutofixSubmitRequest{AutofixID: res.AutofixID, Code: "print('fixed')\n"}, CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != apitypes.AutofixFixed || !done.Success || done.Attempts != 2 || done.LastResult == nil || done.LastResult.Stdout != "ok\n" {
		t.Fatalf("after the fix %+v", done)
	}
	if len(f.created) != 1 || len(f.terminated) != 1 || f.terminated[0] != res.SandboxID {
		t.Fatalf("the loop's one sandbox must be removed at its end: created %d, terminated %v", len(f.created), f.terminated)
	}
	if got := gathered(t, reg, "sandboxd_autofix_runs_total", "fixed"); got != 1 {
		t.Fatalf("autofix_runs_total{outcome=fixed} = %v", got)
	}
	if got := gathered(t, reg, "sandboxd_autofix_attempts_per_success", ""); got != 1 {
		t.Fatalf("autofix_attempts_per_success observed %v loops, want 1", got)
	}
	if len(f.events) == 0 || f.events[len(f.events)-1].Type != "result" {
		t.Fatalf("events %+v: the last must be the result", f.events)
	}
	// A finished loop takes no more fixes.
	if _, err := s.AutofixSubmit(ctx, apitypes.AutofixSubmitRequest{AutofixID: res.AutofixID, Code: "x"}, CallOptions{}); errdefs.CodeOf(err) != errdefs.Conflict {
		t.Fatalf("submit to a finished loop: %v", err)
	}
	var recs []apitypes.CorrectionRecord
	if err := s.ExportCorrections(ctx, func(r apitypes.CorrectionRecord) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Outcome != "fixed" || recs[0].RunID != res.RunID || !strings.Contains(recs[0].Code["main.py"], "undefined_name") || !strings.Contains(recs[0].Error, "NameError") {
		t.Fatalf("corrections %+v", recs)
	}
}

// gathered reads a counter's value (with label value label) or a
// histogram's sample count from the registry.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A parked loop whose sandbox did not survive the wait gets a new one, and
// the next attempt writes everything again.
func TestSubmitReplacesALostSandbox(t *testing.T) {
	s, f, _ := newLoops(t)
	ctx := context.Background()
	res, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Code: "print(undefined_name)\n", Provider: apitypes.ProviderClient}, CallOptions{})
	if err != nil || res.Status != apitypes.AutofixNeedsFix {
		t.Fatalf("%+v, %v", res, err)
	}
	delete(f.boxes, res.SandboxID)
	done, err := s.AutofixSubmit(ctx, apitypes.AutofixSubmitRequest{AutofixID: res.AutofixID, Code: "print('fixed')\n"}, CallOptions{})
	if err != nil || done.Status != apitypes.AutofixFixed || done.SandboxID == res.SandboxID || len(f.created) != 2 {
		t.Fatalf("%+v, %v (created %d)", done, err, len(f.created))
	}
	if f.files[done.SandboxID]["/workspace/main.py"] != "print('fixed')\n" {
		t.Fatalf("new sandbox files %v", f.files[done.SandboxID])
	}
}

// Malformed ids, missing loops, several answers at once and unknown or
// unconfigured providers are refused naming the field, before any sandbox.
func TestRefusals(t *testing.T) {
	s, f, _ := newLoops(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		call  func() error
		code  errdefs.Code
		field string
	}{
		{"malformed id", func() error { _, err := s.AutofixStatus(ctx, "af-../../x"); return err }, errdefs.InvalidArgument, "autofix_id"},
		{"unknown id", func() error { _, err := s.AutofixStatus(ctx, "af-0123456789abcdef"); return err }, errdefs.NotFound, "autofix"},
		{"two answers", func() error {
			_, err := s.AutofixSubmit(ctx, apitypes.AutofixSubmitRequest{AutofixID: "af-0123456789abcdef", Code: "a", Answer: "b"}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "code"},
		{"no answer", func() error {
			_, err := s.AutofixSubmit(ctx, apitypes.AutofixSubmitRequest{AutofixID: "af-0123456789abcdef"}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "code"},
		{"unknown provider", func() error {
			_, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Code: "x", Provider: "oracle"}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "provider"},
		{"agent without credential", func() error {
			_, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Code: "x", Provider: apitypes.ProviderAgent}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "provider"},
		{"test command with NUL", func() error {
			_, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Code: "x", TestCommand: "a\x00b"}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "test_command"},
		{"path outside workspace", func() error {
			_, err := s.Autofix(ctx, apitypes.AutofixRequest{Language: "python", Files: map[string]string{"../x.py": "x"}}, CallOptions{})
			return err
		}, errdefs.InvalidArgument, "files"},
	} {
		err := tc.call()
		if errdefs.CodeOf(err) != tc.code || !strings.HasPrefix(errdefs.MessageOf(err), tc.field) {
			t.Errorf("%s: %v, want %s naming %s", tc.name, err, tc.code, tc.field)
		}
	}
	if len(f.created) != 0 {
		t.Fatalf("a refused request made a sandbox: %+v", f.created)
	}
}
