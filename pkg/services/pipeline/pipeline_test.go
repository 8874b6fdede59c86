package pipeline

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lang"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// fakeSandboxes stands for the sandbox manager and the engine's lifecycle:
// sandboxes whose file systems are maps, and commands answered by exec
// (by default: exit 0, printing "ran <argv>"). Run records are real
// (pkg/runs over SQLite in a temporary directory), so what a run writes is
// read back as a client would.
type fakeSandboxes struct {
	boxes      map[string]*sandbox.Info
	files      map[string]map[string][]byte // sandbox → path → content
	execs      [][]string
	deleted    []string
	created    []apitypes.CreateSandboxRequest
	terminated []string
	exec       func(spec sandbox.ExecSpec) *sandbox.ExecResult
	counted    []string // Metrics.Run calls: language/outcome
	execsSeen  int      // Metrics.Exec calls
	// onTerminate, if not nil, runs first in TerminateSandbox; onCreate,
	// if not nil, may refuse a CreateSandbox.
	onTerminate func(id string)
	onCreate    func() error
	// recorded is the last sandbox whose terminate wrote its record.
	recorded atomic.Value
}

func (f *fakeSandboxes) Get(_ context.Context, id string) (*sandbox.Info, error) {
	if b, ok := f.boxes[id]; ok {
		c := *b
		return &c, nil
	}
	return nil, errdefs.NotFoundf("sandbox %s not found", id)
}

func (f *fakeSandboxes) Exec(_ context.Context, id string, spec sandbox.ExecSpec, out sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	if _, ok := f.boxes[id]; !ok {
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	}
	f.execs = append(f.execs, spec.Argv)
	res := &sandbox.ExecResult{Stdout: "ran " + strings.Join(spec.Argv, " ") + "\n", Termination: sandbox.Termination{Cause: sandbox.CauseExited}}
	if f.exec != nil {
		res = f.exec(spec)
	}
	res.StdoutBytes, res.StderrBytes = int64(len(res.Stdout)), int64(len(res.Stderr))
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
	f.files[id][req.Path] = b
	return &agent.FileInfo{Path: req.Path, Size: int64(len(b))}, nil
}

func (f *fakeSandboxes) ReadFile(_ context.Context, id, path string, _, _ int64) (*agent.FileData, error) {
	b, ok := f.files[id][path]
	if !ok {
		return nil, errdefs.NotFoundf("path: %s does not exist", path)
	}
	return &agent.FileData{Data: b}, nil
}

func (f *fakeSandboxes) ListFiles(_ context.Context, id, dir string, _ bool) ([]agent.FileInfo, error) {
	var out []agent.FileInfo
	for p, b := range f.files[id] {
		if strings.HasPrefix(p, dir+"/") {
			out = append(out, agent.FileInfo{Path: p, Type: agent.TypeFile, Size: int64(len(b))})
		}
	}
	if out == nil {
		return nil, errdefs.NotFoundf("path: %s does not exist", dir)
	}
	return out, nil
}

func (f *fakeSandboxes) DeleteFile(_ context.Context, _ string, path string, _ bool) error {
	f.deleted = append(f.deleted, path)
	return nil
}

func (f *fakeSandboxes) CreateSandbox(_ context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	if f.onCreate != nil {
		if err := f.onCreate(); err != nil {
			return nil, err
		}
	}
	f.created = append(f.created, req)
	id := "sb-new" + string(rune('0'+len(f.created)))
	f.boxes[id] = &sandbox.Info{ID: id, Image: req.Language, Language: req.Language, State: sandbox.StateReady, Network: req.Network}
	f.files[id] = map[string][]byte{}
	return f.boxes[id], nil
}

func (f *fakeSandboxes) CreateRunVM(ctx context.Context, language string, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	return f.CreateSandbox(ctx, req)
}

func (f *fakeSandboxes) TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error) {
	// As the manager does: the record first, then the release.
	f.recorded.Store(id)
	sandbox.TerminateRecorded(ctx)
	if f.onTerminate != nil {
		f.onTerminate(id)
	}
	f.terminated = append(f.terminated, id)
	return f.boxes[id], nil
}

func (f *fakeSandboxes) NetworkMode(field, mode string) (string, error) {
	switch mode {
	case "", "none":
		return "none", nil
	}
	return "", errdefs.Unavailablef("%s: mode %q needs the network subsystem", field, mode)
}

type fakeMetrics struct{ f *fakeSandboxes }

func (m fakeMetrics) Exec(*sandbox.ExecResult) { m.f.execsSeen++ }
func (m fakeMetrics) Run(language, outcome string) {
	m.f.counted = append(m.f.counted, language+"/"+outcome)
}

func newPipeline(t *testing.T) (*Service, *fakeSandboxes) {
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
	f := &fakeSandboxes{boxes: map[string]*sandbox.Info{}, files: map[string]map[string][]byte{}}
	s := New(Options{Sandboxes: f, Lifecycle: f, Catalog: lang.NewCatalog(recipes, []string{"python", "go"}),
		Store: db, Runs: config.Runs{}, StateDir: dir, ExecTimeout: time.Minute, MaxExecTimeout: 10 * time.Minute,
		Metrics: fakeMetrics{f}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	return s, f
}

// run_code without a sandbox: an ephemeral one is created (labelled with
// the run), the code written and run, its output streamed and collected,
// the sandbox terminated, and the run record holds what happened.
func TestRunCodeEphemeral(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	f.exec = func(spec sandbox.ExecSpec) *sandbox.ExecResult {
		// The program leaves a file in /workspace/output.
		for id := range f.boxes {
			f.files[id]["/workspace/output/result.txt"] = []byte("42")
		}
		return &sandbox.ExecResult{Stdout: "hello\n", Termination: sandbox.Termination{Cause: sandbox.CauseExited}}
	}
	var streamed bytes.Buffer
	res, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print('hello')\n"}, func(stream string, b []byte) {
		if stream == "stdout" {
			streamed.Write(b)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.Stdout != "hello\n" || len(res.Steps) != 1 || res.Steps[0].Name != StepRun || streamed.String() != "hello\n" {
		t.Fatalf("result %+v, streamed %q", res, streamed.String())
	}
	if len(f.created) != 1 || f.created[0].Language != "python" || f.created[0].Labels["sandboxd.run"] != res.RunID || f.created[0].Network != "none" {
		t.Fatalf("created %+v (run %s)", f.created, res.RunID)
	}
	// The sandbox is terminated after the answer (TestRunCodeReleasesAfterAnswer).
	s.WaitReleases(ctx)
	if !slices.Equal(f.terminated, []string{res.SandboxID}) {
		t.Fatalf("terminated %v, want the run's sandbox %s", f.terminated, res.SandboxID)
	}
	if got := string(f.files[res.SandboxID]["/workspace/main.py"]); got != "print('hello')\n" {
		t.Fatalf("main.py = %q", got)
	}
	if len(f.execs) != 1 || !slices.Equal(f.execs[0], []string{"python3", "main.py"}) {
		t.Fatalf("execs %v", f.execs)
	}
	if !slices.Equal(res.OutputFiles, []string{"result.txt"}) {
		t.Fatalf("output files %v", res.OutputFiles)
	}
	if !slices.Equal(f.counted, []string{"python/success"}) || f.execsSeen != 1 {
		t.Fatalf("metrics: runs %v, execs %d", f.counted, f.execsSeen)
	}
	run, err := s.GetRun(ctx, res.RunID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !run.Metadata.Success || !run.Metadata.Ephemeral || run.Metadata.SandboxID != res.SandboxID || run.Stdout != "hello\n" ||
		len(run.Metadata.Steps) != 1 || run.Metadata.OutputFiles != 1 {
		t.Fatalf("record %+v stdout %q", run.Metadata, run.Stdout)
	}
	list, err := s.ListRuns(ctx, apitypes.RunFilter{Language: "python"})
	if err != nil || len(list) != 1 || list[0].RunID != res.RunID {
		t.Fatalf("list %+v, %v", list, err)
	}
}

// An ephemeral run answers before its sandbox is terminated: the answer and
// the run record are complete while the terminate is still in flight, and
// WaitReleases returns once it is done.
func TestRunCodeReleasesAfterAnswer(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	entered, gate := make(chan string, 1), make(chan struct{})
	f.onTerminate = func(id string) {
		entered <- id
		<-gate
	}
	res, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(1)\n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The terminated state is written before the answer.
	if got, _ := f.recorded.Load().(string); got != res.SandboxID {
		t.Fatalf("answered before the terminate of %s was recorded (recorded: %q)", res.SandboxID, got)
	}
	var id string
	select {
	case id = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the run's sandbox was never terminated")
	}
	if id != res.SandboxID {
		t.Fatalf("terminated %s, want the run's sandbox %s", id, res.SandboxID)
	}
	// The terminate is held: the record is already there.
	run, err := s.GetRun(ctx, res.RunID, 0)
	if err != nil || !run.Metadata.Success || !run.Metadata.Ephemeral || run.Metadata.SandboxID != res.SandboxID {
		t.Fatalf("record while the terminate runs: %+v, %v", run, err)
	}
	waited := make(chan bool)
	go func() { waited <- s.WaitReleases(ctx) }()
	select {
	case <-waited:
		t.Fatal("WaitReleases returned while a terminate was still in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	if !<-waited {
		t.Fatal("WaitReleases saw no release in flight")
	}
	if !slices.Equal(f.terminated, []string{res.SandboxID}) {
		t.Fatalf("terminated %v", f.terminated)
	}
	if s.WaitReleases(ctx) {
		t.Fatal("a release still in flight after WaitReleases")
	}
}

// A run refused for max_sandboxes or a quota while an earlier run's sandbox
// is still being released waits for that release and tries once more; with
// nothing in flight the refusal stands.
func TestRunCodeWaitsForReleasesAtLimit(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	gate := make(chan struct{})
	f.onTerminate = func(string) { <-gate }
	first, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(1)\n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first run's sandbox still counts until its terminate is done.
	refusals := 0
	f.onCreate = func() error {
		if len(f.terminated) > 0 {
			return nil
		}
		refusals++
		if refusals == 1 {
			close(gate) // the release finishes while the second run waits
		}
		return errdefs.LimitExceededf("max_sandboxes (1) live sandboxes already exist")
	}
	second, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(2)\n"}, nil)
	if err != nil {
		t.Fatalf("second run: %v (refused %d times)", err, refusals)
	}
	if refusals != 1 || second.SandboxID == first.SandboxID || len(f.created) != 2 {
		t.Fatalf("refusals %d, sandboxes %s then %s, created %d", refusals, first.SandboxID, second.SandboxID, len(f.created))
	}
	s.WaitReleases(ctx)
	// Nothing in flight: a refusal is the answer.
	f.onCreate = func() error { return errdefs.LimitExceededf("max_sandboxes (1) live sandboxes already exist") }
	if _, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(3)\n"}, nil); errdefs.CodeOf(err) != errdefs.LimitExceeded {
		t.Fatalf("third run: %v, want limit_exceeded", err)
	}
}

// A compiled language stops at a failing compile step: the run step never
// runs, the result is a failure (not an error), and the run is counted so.
func TestRunCodeCompileFailureStops(t *testing.T) {
	s, f := newPipeline(t)
	f.exec = func(spec sandbox.ExecSpec) *sandbox.ExecResult {
		return &sandbox.ExecResult{ExitCode: 1, Stderr: "main.go:1: syntax error\n", Termination: sandbox.Termination{Cause: sandbox.CauseExited}}
	}
	res, err := s.RunCode(context.Background(), apitypes.RunCodeRequest{Language: "go", Code: "package main\nfunc main( {}\n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || len(res.Steps) != 1 || res.Steps[0].Name != StepCompile || res.ExitCode != 1 || !strings.Contains(res.Stderr, "syntax error") {
		t.Fatalf("result %+v", res)
	}
	if len(f.execs) != 1 || !slices.Contains(f.execs[0], buildRoot+"/"+res.RunID) {
		t.Fatalf("execs %v: want only the compile step, into the run's build directory", f.execs)
	}
	if _, ok := f.files[res.SandboxID][buildRoot+"/"+res.RunID+"/.keep"]; !ok {
		t.Fatalf("no build directory made: %v", f.files[res.SandboxID])
	}
	if !slices.Equal(f.counted, []string{"go/failure"}) {
		t.Fatalf("counted %v", f.counted)
	}
}

// Offline dependency installs that needed the network are an unavailable
// error naming the manager and the sandbox, not a failed program.
func TestRunCodeOfflineInstall(t *testing.T) {
	s, f := newPipeline(t)
	f.exec = func(spec sandbox.ExecSpec) *sandbox.ExecResult {
		if spec.Env["PIP_NO_INDEX"] != "1" {
			t.Errorf("install without the offline environment: %v", spec.Env)
		}
		return &sandbox.ExecResult{ExitCode: 1, Stderr: "ERROR: No matching distribution found for requests\n", Termination: sandbox.Termination{Cause: sandbox.CauseExited}}
	}
	_, err := s.RunCode(context.Background(), apitypes.RunCodeRequest{Language: "python", Code: "import requests\n",
		Files: map[string]string{"requirements.txt": "requests\n"}}, nil)
	if errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "pip") || !strings.Contains(err.Error(), "no network") {
		t.Fatalf("err = %v, want unavailable naming pip and the missing network", err)
	}
	s.WaitReleases(context.Background())
	if len(f.execs) != 1 || len(f.terminated) != 1 || !slices.Equal(f.counted, []string{"python/error"}) {
		t.Fatalf("execs %v, terminated %v, counted %v", f.execs, f.terminated, f.counted)
	}
}

// In a given sandbox the run leaves the sandbox running and removes only its
// build directory; a sandbox of another language, or one not live, is
// refused naming sandbox_id.
func TestRunCodeGivenSandbox(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	f.boxes["sb-py"] = &sandbox.Info{ID: "sb-py", Image: "python", Language: "python", State: sandbox.StateReady}
	f.boxes["sb-go"] = &sandbox.Info{ID: "sb-go", Image: "go", Language: "go", State: sandbox.StateReady}
	f.boxes["sb-old"] = &sandbox.Info{ID: "sb-old", Image: "python", Language: "python", State: sandbox.StateTerminated}
	f.files["sb-py"] = map[string][]byte{}
	res, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(1)\n", SandboxID: "sb-py"}, nil)
	if err != nil || !res.Success || res.SandboxID != "sb-py" {
		t.Fatalf("%+v, %v", res, err)
	}
	if len(f.created) != 0 || len(f.terminated) != 0 || !slices.Equal(f.deleted, []string{buildRoot + "/" + res.RunID}) {
		t.Fatalf("created %v, terminated %v, deleted %v", f.created, f.terminated, f.deleted)
	}
	for _, tc := range []struct {
		id   string
		code errdefs.Code
	}{{"sb-go", errdefs.InvalidArgument}, {"sb-old", errdefs.Conflict}, {"sb-gone", errdefs.NotFound}, {"../x", errdefs.InvalidArgument}} {
		_, err := s.RunCode(ctx, apitypes.RunCodeRequest{Language: "python", Code: "print(1)\n", SandboxID: tc.id}, nil)
		if errdefs.CodeOf(err) != tc.code || (tc.code != errdefs.NotFound && !strings.Contains(err.Error(), "sandbox")) {
			t.Errorf("sandbox_id %q: %v, want %s", tc.id, err, tc.code)
		}
	}
}

// Hostile or malformed input is refused before any sandbox is made, with
// the field named.
func TestRunCodeRefusesHostileInput(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	long := strings.Repeat("a", 2000)
	for _, tc := range []struct {
		req   apitypes.RunCodeRequest
		field string
	}{
		{apitypes.RunCodeRequest{Language: "cobol", Code: "x"}, "language"},
		{apitypes.RunCodeRequest{Language: "python"}, "code"},
		{apitypes.RunCodeRequest{Language: "python", Files: map[string]string{"../etc/passwd": "x"}}, "files"},
		{apitypes.RunCodeRequest{Language: "python", Files: map[string]string{"/etc/passwd": "x"}}, "files"},
		{apitypes.RunCodeRequest{Language: "python", Files: map[string]string{"a\x00b.py": "x"}}, "files"},
		{apitypes.RunCodeRequest{Language: "python", Files: map[string]string{long: "x"}}, "files"},
		{apitypes.RunCodeRequest{Language: "python", Files: map[string]string{"a": "x", "a/b.py": "y"}}, "files"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Entrypoint: "../../main.py"}, "entrypoint"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Args: []string{"a\x00"}}, "args"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Stdin: strings.Repeat("x", apitypes.MaxStdin+1)}, "stdin"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Env: map[string]string{"A=B": "1"}}, "env"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Backend: "xen"}, "backend"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", Network: "egress"}, "network"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", TimeoutSeconds: ptr(-1.0)}, "timeout_seconds"},
		{apitypes.RunCodeRequest{Language: "python", Code: "x", TimeoutSeconds: ptr(1e9)}, "timeout_seconds"},
		{apitypes.RunCodeRequest{Language: "python", Code: strings.Repeat("x", MaxRunFilesBytes+1)}, "files"},
	} {
		_, err := s.RunCode(ctx, tc.req, nil)
		if err == nil || !strings.HasPrefix(errdefs.MessageOf(err), tc.field) {
			t.Errorf("%.80v: %v, want an error naming %s", tc.req, err, tc.field)
		}
		if c := errdefs.CodeOf(err); c != errdefs.InvalidArgument && c != errdefs.LimitExceeded && c != errdefs.Unavailable {
			t.Errorf("%.80v: code %s", tc.req, c)
		}
	}
	if len(f.created) != 0 || len(f.execs) != 0 {
		t.Fatalf("a refused request reached a sandbox: created %v, execs %v", f.created, f.execs)
	}
	for _, lim := range []int{-1, 1001} {
		if _, err := s.ListRuns(ctx, apitypes.RunFilter{Limit: lim}); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(errdefs.MessageOf(err), "limit") {
			t.Errorf("limit %d: %v", lim, err)
		}
	}
}

// A step the deadline leaves no time for is reported timed out without
// running; the record says so.
func TestStepPastDeadline(t *testing.T) {
	s, f := newPipeline(t)
	ctx := context.Background()
	h, _, err := s.catalog.Handler("language", "python")
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.StartRun(ctx, RunSpec{Handler: h, Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	run.SetDeadline(time.Now().Add(-time.Second))
	res := &RunResult{}
	st, err := run.Step(ctx, &Attempt{}, res, "test", []string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Termination.Cause != sandbox.CauseTimeout || StepOK(st) || len(f.execs) != 0 || len(run.Meta.Steps) != 1 {
		t.Fatalf("step %+v, execs %v, meta steps %v", st, f.execs, run.Meta.Steps)
	}
	if err := run.Finish(ctx, res, nil); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetRun(ctx, run.Record.ID, 0)
	if err != nil || got.Metadata.Success || got.Metadata.Termination.Cause != sandbox.CauseTimeout {
		t.Fatalf("record %+v, %v", got, err)
	}
}

// Blocked syscalls of several steps add up by name.
func TestMergeBlocked(t *testing.T) {
	got := mergeBlocked([]apitypes.BlockedSyscall{{Name: "mount", Count: 1}},
		[]apitypes.BlockedSyscall{{Name: "ptrace", Count: 2}, {Name: "mount", Count: 3}})
	sort.Slice(got, func(i, j int) bool { return got[i].Name < got[j].Name })
	if len(got) != 2 || got[0] != (apitypes.BlockedSyscall{Name: "mount", Count: 4}) || got[1] != (apitypes.BlockedSyscall{Name: "ptrace", Count: 2}) {
		t.Fatalf("%+v", got)
	}
}

func ptr[T any](v T) *T { return &v }
