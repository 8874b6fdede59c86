package agents

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// fakeEngine stands for the sandbox service, the images and the credential
// proxy: one sandbox "sb1" whose /workspace is a map, and a Claude Code CLI
// that prints a fixed stream-json session and edits one file. The run
// records are real (pkg/runs over SQLite), so the session's record is
// checked as written.
type fakeEngine struct {
	files     map[string]string
	stream    string
	hasCLI    bool
	credOK    bool
	usage     network.CredentialUsage
	created   []apitypes.CreateSandboxRequest
	ended     []string
	runs      *runs.Store
	execArgvs [][]string
}

func (f *fakeEngine) CreateSandbox(_ context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error) {
	f.created = append(f.created, req)
	return &sandbox.Info{ID: "sb1", Image: req.Image, Language: req.Language}, nil
}

func (f *fakeEngine) TerminateSandbox(_ context.Context, id string) (*sandbox.Info, error) {
	f.ended = append(f.ended, id)
	return &sandbox.Info{ID: id}, nil
}

func (f *fakeEngine) WriteFile(_ context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error) {
	f.files[strings.TrimPrefix(req.Path, "/workspace/")] = req.Content
	return &apitypes.FileResult{}, nil
}

func (f *fakeEngine) ReadFile(_ context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error) {
	c, ok := f.files[strings.TrimPrefix(req.Path, "/workspace/")]
	if !ok {
		return nil, errdefs.NotFoundf("path: no such file")
	}
	return &apitypes.FileReadResult{Content: c}, nil
}

func (f *fakeEngine) ListFiles(context.Context, string, string, bool) ([]apitypes.FileEntry, error) {
	var out []apitypes.FileEntry
	for p, c := range f.files {
		out = append(out, apitypes.FileEntry{Path: "/workspace/" + p, Type: "file", Size: int64(len(c))})
	}
	return out, nil
}

func (f *fakeEngine) Get(_ context.Context, id string) (*sandbox.Info, error) {
	if id != "sb1" {
		return nil, errdefs.NotFoundf("sandbox_id: no sandbox %q", id)
	}
	return &sandbox.Info{ID: id, Image: "agent", Language: "agent"}, nil
}

func (f *fakeEngine) Exec(_ context.Context, _ string, spec sandbox.ExecSpec, out sandbox.OutputFunc) (*sandbox.ExecResult, error) {
	f.execArgvs = append(f.execArgvs, spec.Argv)
	if spec.Argv[0] == "sh" { // command -v claude
		if f.hasCLI {
			return &sandbox.ExecResult{}, nil
		}
		return &sandbox.ExecResult{ExitCode: 1}, nil
	}
	f.files["calc.py"] = "def add(a, b):\n    return a + b\n"
	delete(f.files, "old.txt")
	out("stdout", []byte(f.stream[:10]))
	out("stdout", []byte(f.stream[10:]))
	return &sandbox.ExecResult{}, nil
}

func (f *fakeEngine) Known(name string) bool { return name == "agent" || name == "shell" }
func (f *fakeEngine) KnownNames() []string   { return []string{"agent", "shell"} }

func (f *fakeEngine) New() (*runs.Record, error) { return f.runs.Create() }
func (f *fakeEngine) ContainerInfo(info *sandbox.Info, ephemeral bool) map[string]any {
	return map[string]any{"sandboxId": info.ID, "ephemeral": ephemeral}
}
func (f *fakeEngine) Finish(ctx context.Context, r *runs.Record, m *runs.Metadata) error {
	return f.runs.Finish(ctx, r, m)
}
func (f *fakeEngine) AgentCredential() bool { return f.credOK }
func (f *fakeEngine) Usage(_, credential string) (network.CredentialUsage, bool) {
	return f.usage, credential == AgentCredential
}

const session = `{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Edit","input":{"file_path":"/workspace/calc.py"}}]}}
{"type":"assistant","message":{"content":[{"type":"text","text":"fixed"}]}}
{"type":"result","subtype":"success","is_error":false,"result":"Fixed add.","num_turns":3}
`

func newFake(t *testing.T) (*Service, *fakeEngine) {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	rs, err := runs.Open(filepath.Join(dir, "runs"), db, runs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEngine{files: map[string]string{"old.txt": "x"}, stream: session, hasCLI: true, credOK: true, runs: rs,
		usage: network.CredentialUsage{Requests: 2, InputTokens: 100, OutputTokens: 20}}
	return New(Options{Sandboxes: f, Images: f, Records: f, Credentials: f, MaxLifetime: time.Hour}), f
}

func TestRunRefusesBadRequests(t *testing.T) {
	ctx := context.Background()
	s, f := newFake(t)
	for _, tc := range []struct {
		req   AgentRunRequest
		code  errdefs.Code
		field string
	}{
		{AgentRunRequest{Prompt: "  "}, errdefs.InvalidArgument, "prompt:"},
		{AgentRunRequest{Prompt: "x", MaxTurns: -1}, errdefs.InvalidArgument, "max_turns:"},
		{AgentRunRequest{Prompt: "x", MaxTurns: maxAgentTurns + 1}, errdefs.InvalidArgument, "max_turns:"},
		{AgentRunRequest{Prompt: "x", TimeoutSeconds: math.NaN()}, errdefs.InvalidArgument, "timeout:"},
		{AgentRunRequest{Prompt: "x", TimeoutSeconds: math.Inf(1)}, errdefs.InvalidArgument, "timeout:"},
		{AgentRunRequest{Prompt: "x", TimeoutSeconds: 7200}, errdefs.InvalidArgument, "timeout:"},
		{AgentRunRequest{Prompt: "x", Files: map[string]string{"../etc/passwd": "x"}}, errdefs.InvalidArgument, "files:"},
		{AgentRunRequest{Prompt: "x", Files: map[string]string{"/abs": "x"}}, errdefs.InvalidArgument, "files:"},
		{AgentRunRequest{Prompt: "x", Language: "nosuch"}, errdefs.InvalidArgument, "language: unknown image"},
		{AgentRunRequest{Prompt: "x", SandboxID: "nosuch"}, errdefs.NotFound, "sandbox_id:"},
	} {
		_, err := s.Run(ctx, tc.req, nil)
		if errdefs.CodeOf(err) != tc.code || !strings.HasPrefix(errdefs.MessageOf(err), tc.field) {
			t.Errorf("run %+v: %v, want %s starting %q", tc.req, err, tc.code, tc.field)
		}
	}
	f.hasCLI = false
	if _, err := s.Run(ctx, AgentRunRequest{Prompt: "x", SandboxID: "sb1"}, nil); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.HasPrefix(errdefs.MessageOf(err), "sandbox_id:") {
		t.Errorf("a sandbox without the CLI: %v", err)
	}
	f.credOK = false
	if _, err := s.Run(ctx, AgentRunRequest{Prompt: "x"}, nil); errdefs.CodeOf(err) != errdefs.Unavailable || !strings.Contains(err.Error(), "network.credentials.anthropic") {
		t.Errorf("no credential: %v", err)
	}
	if len(f.created) != 0 {
		t.Errorf("sandboxes created for refused requests: %+v", f.created)
	}
}

func TestRunSessionInOwnSandbox(t *testing.T) {
	ctx := context.Background()
	s, f := newFake(t)
	var kinds []string
	res, err := s.Run(ctx, AgentRunRequest{Prompt: "Fix calc.py", Files: map[string]string{"calc.py": "def add(a, b):\n    return a - b\n"}},
		func(p AgentProgress) { kinds = append(kinds, p.Kind) })
	if err != nil {
		t.Fatal(err)
	}
	if len(f.created) != 1 || f.created[0].Image != AgentImage || f.created[0].Network != "allowlist" || f.created[0].Credentials[0] != AgentCredential {
		t.Fatalf("created %+v: want one agent sandbox on an empty allowlist with the credential", f.created)
	}
	if len(f.ended) != 1 || f.ended[0] != "sb1" {
		t.Fatalf("terminated %v: want the session's own sandbox", f.ended)
	}
	if !res.Success || res.Summary != "Fixed add." || res.NumTurns != 3 || res.Usage.InputTokens != 100 {
		t.Fatalf("result %+v", res)
	}
	want := map[string]string{"calc.py": "modified", "old.txt": "deleted"}
	if len(res.Changes) != 2 {
		t.Fatalf("changes %+v, want %v", res.Changes, want)
	}
	for _, c := range res.Changes {
		if want[c.Path] != c.Status {
			t.Errorf("change %+v, want %v", c, want)
		}
	}
	if !strings.Contains(res.Diff, "-    return a - b") || !strings.Contains(res.Diff, "+    return a + b") {
		t.Errorf("diff %q", res.Diff)
	}
	if got := strings.Join(kinds, ","); got != "started,tool_call,file_changed,text,result" {
		t.Errorf("progress %s", got)
	}
	run, err := f.runs.Get(ctx, res.RunID, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if m := run.Metadata; m.Kind != "agent" || !m.Success || m.SandboxID != "sb1" || !m.Ephemeral || len(m.Steps) != 1 || m.Steps[0].Name != "agent" {
		t.Fatalf("record metadata %+v", m)
	}
	transcript, err := os.ReadFile(res.Transcript)
	if err != nil || string(transcript) != session {
		t.Fatalf("transcript %q, %v: want the CLI's whole output", transcript, err)
	}

	// A spend cap reached makes the session a failure naming the cap.
	f.usage.CapReached = "max_tokens"
	res, err = s.Run(ctx, AgentRunRequest{Prompt: "again", SandboxID: "sb1"}, nil)
	if err != nil || res.Success || res.Cause != "spend_cap: max_tokens" {
		t.Fatalf("capped session: %+v, %v", res, err)
	}
}
