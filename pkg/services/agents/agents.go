// Package agents is the agent-session service (docs/agents.md): Claude Code
// in print mode inside a sandbox whose only reachable destination is the
// credential proxy, kept in a run record of kind "agent" (record.go). It
// reaches sandboxes, images, run records and credential usage only through
// the narrow interfaces below; pkg/engine composes it and keeps the autofix
// provider "agent" over it.
package agents

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

type (
	AgentRunRequest = apitypes.AgentRunRequest
	AgentRunResult  = apitypes.AgentRunResult
	AgentProgress   = apitypes.AgentProgress
)

// Sandboxes is what a session needs of the sandbox service: the engine's
// validated create, terminate and file operations, and the manager's
// lookup and exec.
type Sandboxes interface {
	CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*sandbox.Info, error)
	TerminateSandbox(ctx context.Context, id string) (*sandbox.Info, error)
	WriteFile(ctx context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error)
	ReadFile(ctx context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error)
	ListFiles(ctx context.Context, id, p string, recursive bool) ([]apitypes.FileEntry, error)
	Get(ctx context.Context, id string) (*sandbox.Info, error)
	Exec(ctx context.Context, id string, spec sandbox.ExecSpec, onOutput sandbox.OutputFunc) (*sandbox.ExecResult, error)
}

// Images is what a session needs of the image service.
type Images interface {
	Known(name string) bool
	KnownNames() []string
}

// Records makes and indexes run records (the run pipeline's store).
type Records interface {
	// New creates the directory and metadata of a new run record.
	New() (*runs.Record, error)
	// ContainerInfo is container_info.json of a record of sandbox info.
	ContainerInfo(info *sandbox.Info, ephemeral bool) map[string]any
	Finish(ctx context.Context, r *runs.Record, m *runs.Metadata) error
}

// Credentials tells whether the agent credential is configured (and the
// network up), and what a sandbox spent through it.
type Credentials interface {
	AgentCredential() bool
	Usage(id, credential string) (network.CredentialUsage, bool)
}

// Options are what New needs.
type Options struct {
	Sandboxes   Sandboxes
	Images      Images
	Records     Records
	Credentials Credentials
	MaxLifetime time.Duration // sandbox.max_lifetime: a session's timeout cap
}

// Service runs agent sessions.
type Service struct{ o Options }

// New returns the agent-session service.
func New(o Options) *Service { return &Service{o: o} }

const (
	// AgentCredential is the credential (network.credentials) agent
	// sessions are granted: the Messages API.
	AgentCredential = "anthropic"
	// AgentImage is the default image of agent sessions.
	AgentImage = "agent"
	// DefaultTimeout is a session's timeout when the request sets none.
	DefaultTimeout = defaultAgentTimeout
	// agentCLI is the Claude Code command the image must have.
	agentCLI = "claude"

	defaultAgentTurns   = 20
	maxAgentTurns       = 200
	defaultAgentTimeout = 600 * time.Second
	// maxAgentFile bounds the content of a file returned in Files.
	maxAgentFile = 256 << 10
)

// Run runs one agent session; progress, if not nil, sees the session
// start (its run record and sandbox), tool calls, changed files and the
// result as they stream. The session is kept in a run record of kind
// "agent" (record.go).
func (s *Service) Run(ctx context.Context, req AgentRunRequest, progress func(AgentProgress)) (*AgentRunResult, error) {
	if strings.TrimSpace(req.Prompt) == "" {
		return nil, errdefs.Invalidf("prompt: required")
	}
	turns := req.MaxTurns
	if turns == 0 {
		turns = defaultAgentTurns
	}
	if turns < 1 || turns > maxAgentTurns {
		return nil, errdefs.Invalidf("max_turns: %d is outside 1..%d", req.MaxTurns, maxAgentTurns)
	}
	timeout := defaultAgentTimeout
	if req.TimeoutSeconds != 0 {
		// The shared validator: NaN, infinities and seconds that overflow
		// a duration are invalid_argument, not a wrapped negative timeout.
		var err error
		if timeout, err = apitypes.Seconds("timeout", req.TimeoutSeconds, s.o.MaxLifetime); err != nil {
			return nil, err
		}
	}
	for p := range req.Files {
		if !filepath.IsLocal(p) {
			return nil, errdefs.Invalidf("files: %q must be a relative path under /workspace", p)
		}
	}
	if progress == nil {
		progress = func(AgentProgress) {}
	}
	id := req.SandboxID
	if id == "" {
		if !s.o.Credentials.AgentCredential() {
			return nil, errdefs.Unavailablef("network.credentials.%s: agent sessions need this credential configured (and the network subsystem up)", AgentCredential)
		}
		image := req.Language
		if image == "" {
			image = AgentImage
		}
		if !s.o.Images.Known(image) {
			return nil, errdefs.Invalidf("language: unknown image %q (known: %s; agent sessions need one with the Claude Code CLI, s.g. %s)", image, strings.Join(s.o.Images.KnownNames(), ", "), AgentImage)
		}
		// An allowlist with nothing in it: the credential proxy on the
		// gateway is the only destination.
		info, err := s.o.Sandboxes.CreateSandbox(ctx, apitypes.CreateSandboxRequest{Image: image, Language: image, Network: string(network.ModeAllowlist),
			Credentials: []string{AgentCredential}, Labels: map[string]string{"agent_session": "true"}})
		if err != nil {
			return nil, err
		}
		id = info.ID
		defer func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = s.o.Sandboxes.TerminateSandbox(tctx, id)
		}()
	}
	if res, err := s.o.Sandboxes.Exec(ctx, id, sandbox.ExecSpec{Argv: []string{"sh", "-c", "command -v " + agentCLI}}, nil); err != nil {
		return nil, err
	} else if res.ExitCode != 0 {
		field := "language"
		if req.SandboxID != "" {
			field = "sandbox_id"
		}
		return nil, errdefs.Invalidf("%s: the image has no Claude Code CLI (%s); use the %s image", field, agentCLI, AgentImage)
	}
	for p, content := range req.Files {
		if _, err := s.o.Sandboxes.WriteFile(ctx, apitypes.FileWriteRequest{SandboxID: id, Path: path.Join("/workspace", filepath.ToSlash(p)), Content: content}); err != nil {
			return nil, err
		}
	}
	before, err := s.workspaceFiles(ctx, id)
	if err != nil {
		return nil, err
	}

	rec, err := s.startRecord(ctx, id, req.Files, req.SandboxID == "")
	if err != nil {
		return nil, err
	}
	out, err := s.agentSession(ctx, id, rec, req.Prompt, turns, timeout, before, progress)
	return out, rec.finish(ctx, out, err)
}

// agentSession runs the CLI in sandbox id and collects its outcome: the
// transcript goes to the record, the progress to progress and the
// record's stdout.log.
func (s *Service) agentSession(ctx context.Context, id string, rec *agentRecord, prompt string, turns int, timeout time.Duration,
	before map[string]workspaceFile, progress func(AgentProgress)) (*AgentRunResult, error) {
	progress(AgentProgress{Kind: "started", RunID: rec.ID, SandboxID: id})
	st := &agentStream{progress: func(p AgentProgress) {
		rec.logProgress(p)
		progress(p)
	}, transcript: rec.transcript}
	argv := []string{agentCLI, "-p", prompt, "--output-format", "stream-json", "--verbose",
		"--max-turns", strconv.Itoa(turns), "--dangerously-skip-permissions"}
	rec.argv = argv
	res, err := s.o.Sandboxes.Exec(ctx, id, sandbox.ExecSpec{Argv: argv, Timeout: timeout, MaxResultBytes: 64 << 10,
		Env: map[string]string{"IS_SANDBOX": "1"}}, func(stream string, data []byte) {
		if stream == "stdout" {
			st.write(data)
		} else {
			_, _ = rec.Stderr.Write(data)
		}
	})
	if err != nil {
		return nil, err
	}
	st.flush()
	rec.Meta.Termination = runs.Termination(res.Termination) // same fields

	out := &AgentRunResult{SandboxID: id, RunID: rec.ID, Transcript: rec.transcriptPath, ExitCode: res.ExitCode, Summary: st.summary, NumTurns: st.turns}
	out.Success = res.ExitCode == 0 && st.subtype == "success" && !st.isError
	switch {
	case res.Termination.Cause == apitypes.CauseTimeout:
		out.Cause = "timeout"
	case st.subtype == "error_max_turns":
		out.Cause = "max_turns"
	case !out.Success && st.subtype != "" && st.subtype != "success":
		out.Cause = st.subtype
	case !out.Success:
		out.Cause = "agent_error"
	}
	if u, ok := s.o.Credentials.Usage(id, AgentCredential); ok {
		out.Usage = apitypes.CredentialUsage(u)
		if u.CapReached != "" {
			out.Success, out.Cause = false, "spend_cap: "+u.CapReached
		}
	}
	after, err := s.workspaceFiles(ctx, id)
	if err != nil {
		return nil, err
	}
	out.Files = map[string]string{}
	for p, c := range after {
		if c.content != nil {
			out.Files[p] = *c.content
		}
		if b, ok := before[p]; !ok {
			out.Changes = append(out.Changes, apitypes.AgentFileChange{Path: p, Status: "added"})
		} else if !c.same(b) {
			out.Changes = append(out.Changes, apitypes.AgentFileChange{Path: p, Status: "modified"})
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out.Changes = append(out.Changes, apitypes.AgentFileChange{Path: p, Status: "deleted"})
		}
	}
	slices.SortFunc(out.Changes, func(a, b apitypes.AgentFileChange) int { return strings.Compare(a.Path, b.Path) })
	if out.Changes == nil {
		out.Changes = []apitypes.AgentFileChange{}
	}
	out.Diff = textDiff(before, after)
	return out, nil
}

// textDiff is the unified diff of the text files from before to after. A
// file that is text on one side only (binary, or past maxAgentFile) is
// left out: Changes lists it.
func textDiff(before, after map[string]workspaceFile) string {
	text := func(side, other map[string]workspaceFile) autofix.Files {
		f := autofix.Files{}
		for p, c := range side {
			if o, ok := other[p]; c.content != nil && (!ok || o.content != nil) {
				f[p] = []byte(*c.content)
			}
		}
		return f
	}
	return autofix.UnifiedDiff(text(before, after), text(after, before))
}

// workspaceFile is a file's content (nil if too large or not text) and
// size, to compare before and after.
type workspaceFile struct {
	content *string
	size    int64
	mtime   time.Time
}

func (a workspaceFile) same(b workspaceFile) bool {
	if a.content != nil && b.content != nil {
		return *a.content == *b.content
	}
	return a.size == b.size && a.mtime.Equal(b.mtime)
}

// skipDir leaves caches and VCS data out of a session's files.
func skipDir(p string) bool {
	for _, part := range strings.Split(p, "/") {
		switch part {
		case ".git", "__pycache__", ".pytest_cache", "node_modules", ".venv":
			return true
		}
	}
	return false
}

// workspaceFiles reads the regular files under /workspace, by path
// relative to it.
func (s *Service) workspaceFiles(ctx context.Context, id string) (map[string]workspaceFile, error) {
	entries, err := s.o.Sandboxes.ListFiles(ctx, id, "/workspace", true)
	if err != nil {
		return nil, err
	}
	out := map[string]workspaceFile{}
	for _, en := range entries {
		rel := strings.TrimPrefix(strings.TrimPrefix(en.Path, "/workspace"), "/")
		if en.Type != "file" || rel == "" || skipDir(rel) {
			continue
		}
		f := workspaceFile{size: en.Size, mtime: en.MTime}
		if en.Size <= maxAgentFile {
			r, err := s.o.Sandboxes.ReadFile(ctx, apitypes.FileReadRequest{SandboxID: id, Path: "/workspace/" + rel, MaxBytes: maxAgentFile})
			if err == nil && r.Encoding != "base64" && !r.Truncated {
				c := r.Content
				f.content = &c
			}
		}
		out[rel] = f
	}
	return out, nil
}

// agentStream reads Claude Code's stream-json output: one JSON object per
// line, kept in the transcript and turned into progress.
type agentStream struct {
	mu         sync.Mutex
	buf        bytes.Buffer
	progress   func(AgentProgress)
	transcript *os.File

	summary, subtype string
	isError          bool
	turns            int
}

func (s *agentStream) write(data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.transcript.Write(data)
	s.buf.Write(data)
	for {
		i := bytes.IndexByte(s.buf.Bytes(), '\n')
		if i < 0 {
			return
		}
		s.line(bytes.TrimSpace(s.buf.Next(i + 1)))
	}
}

func (s *agentStream) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rest := bytes.TrimSpace(s.buf.Bytes()); len(rest) > 0 {
		s.line(rest)
	}
	s.buf.Reset()
}

// streamEvent is the part of a stream-json line we read.
type streamEvent struct {
	Type     string `json:"type"`
	Subtype  string `json:"subtype"`
	IsError  bool   `json:"is_error"`
	Result   string `json:"result"`
	NumTurns int    `json:"num_turns"`
	Message  struct {
		Content []struct {
			Type  string          `json:"type"`
			Name  string          `json:"name"`
			Text  string          `json:"text"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
	} `json:"message"`
}

func (s *agentStream) line(l []byte) {
	var ev streamEvent
	if len(l) == 0 || json.Unmarshal(l, &ev) != nil {
		return
	}
	switch ev.Type {
	case "assistant":
		for _, c := range ev.Message.Content {
			switch c.Type {
			case "tool_use":
				var in struct {
					FilePath string `json:"file_path"`
					Command  string `json:"command"`
					Path     string `json:"path"`
				}
				_ = json.Unmarshal(c.Input, &in)
				detail := cmp.Or(in.FilePath, in.Command, in.Path)
				s.progress(AgentProgress{Kind: "tool_call", Tool: c.Name, Detail: detail})
				switch c.Name {
				case "Write", "Edit", "MultiEdit", "NotebookEdit":
					s.progress(AgentProgress{Kind: "file_changed", Tool: c.Name, Detail: in.FilePath})
				}
			case "text":
				if c.Text != "" {
					s.progress(AgentProgress{Kind: "text", Detail: c.Text})
				}
			}
		}
	case "result":
		s.summary, s.subtype, s.isError, s.turns = ev.Result, ev.Subtype, ev.IsError, ev.NumTurns
		s.progress(AgentProgress{Kind: "result", Detail: ev.Subtype})
	}
}
