package engine

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// Agent sessions (docs/agents.md): Claude Code in print mode inside a
// sandbox whose only reachable destination is the credential proxy, which
// adds the API key at the egress.
type (
	AgentRunRequest = apitypes.AgentRunRequest
	AgentRunResult  = apitypes.AgentRunResult
	AgentProgress   = apitypes.AgentProgress
)

const (
	// AgentCredential is the credential (network.credentials) agent
	// sessions are granted: the Messages API.
	AgentCredential = "anthropic"
	// AgentImage is the default image of agent sessions.
	AgentImage = "agent"
	// agentCLI is the Claude Code command the image must have.
	agentCLI = "claude"

	defaultAgentTurns   = 20
	maxAgentTurns       = 200
	defaultAgentTimeout = 600 * time.Second
	// maxAgentFile bounds the content of a file returned in Files.
	maxAgentFile = 256 << 10
)

// AgentRun runs one agent session; progress, if not nil, sees the session
// start (its run record and sandbox), tool calls, changed files and the
// result as they stream. The session is kept in a run record of kind
// "agent" (agents_record.go).
func (e *Engine) AgentRun(ctx context.Context, req AgentRunRequest, progress func(AgentProgress)) (*AgentRunResult, error) {
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
		if timeout, err = duration("timeout", req.TimeoutSeconds, e.cfg.Sandbox.MaxLifetime.D()); err != nil {
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
		if e.net == nil || e.netCfg.Credentials[AgentCredential].BaseURL == nil {
			return nil, errdefs.Unavailablef("network.credentials.%s: agent sessions need this credential configured (and the network subsystem up)", AgentCredential)
		}
		image := req.Language
		if image == "" {
			image = AgentImage
		}
		if !e.imageKnown(image) {
			return nil, errdefs.Invalidf("language: unknown image %q (known: %s; agent sessions need one with the Claude Code CLI, e.g. %s)", image, strings.Join(e.knownImages(), ", "), AgentImage)
		}
		// An allowlist with nothing in it: the credential proxy on the
		// gateway is the only destination.
		info, err := e.CreateSandbox(ctx, CreateSandboxRequest{Image: image, Language: image, Network: NetworkAllowlist,
			Credentials: []string{AgentCredential}, Labels: map[string]string{"agent_session": "true"}})
		if err != nil {
			return nil, err
		}
		id = info.ID
		defer func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = e.TerminateSandbox(tctx, id)
		}()
	}
	if res, err := e.sandboxes.Exec(ctx, id, sandbox.ExecSpec{Argv: []string{"sh", "-c", "command -v " + agentCLI}}, nil); err != nil {
		return nil, err
	} else if res.ExitCode != 0 {
		field := "language"
		if req.SandboxID != "" {
			field = "sandbox_id"
		}
		return nil, errdefs.Invalidf("%s: the image has no Claude Code CLI (%s); use the %s image", field, agentCLI, AgentImage)
	}
	for p, content := range req.Files {
		if _, err := e.WriteFile(ctx, FileWriteRequest{SandboxID: id, Path: path.Join("/workspace", filepath.ToSlash(p)), Content: content}); err != nil {
			return nil, err
		}
	}
	before, err := e.workspaceFiles(ctx, id)
	if err != nil {
		return nil, err
	}

	rec, err := e.startAgentRecord(ctx, id, req.Files, req.SandboxID == "")
	if err != nil {
		return nil, err
	}
	out, err := e.agentSession(ctx, id, rec, req.Prompt, turns, timeout, before, progress)
	return out, rec.finish(ctx, out, err)
}

// agentSession runs the CLI in sandbox id and collects its outcome: the
// transcript goes to the record, the progress to progress and the
// record's stdout.log.
func (e *Engine) agentSession(ctx context.Context, id string, rec *agentRecord, prompt string, turns int, timeout time.Duration,
	before map[string]workspaceFile, progress func(AgentProgress)) (*AgentRunResult, error) {
	progress(AgentProgress{Kind: "started", RunID: rec.ID, SandboxID: id})
	st := &agentStream{progress: func(p AgentProgress) {
		rec.logProgress(p)
		progress(p)
	}, transcript: rec.transcript}
	argv := []string{agentCLI, "-p", prompt, "--output-format", "stream-json", "--verbose",
		"--max-turns", strconv.Itoa(turns), "--dangerously-skip-permissions"}
	rec.argv = argv
	res, err := e.sandboxes.Exec(ctx, id, sandbox.ExecSpec{Argv: argv, Timeout: timeout, MaxResultBytes: 64 << 10,
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
	rec.Meta.Termination = recordTermination(res.Termination)

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
	if e.net != nil {
		if u, ok := e.net.CredentialUsage(id)[AgentCredential]; ok {
			out.Usage = apitypes.CredentialUsage(u)
			if u.CapReached != "" {
				out.Success, out.Cause = false, "spend_cap: "+u.CapReached
			}
		}
	}
	after, err := e.workspaceFiles(ctx, id)
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
func (e *Engine) workspaceFiles(ctx context.Context, id string) (map[string]workspaceFile, error) {
	entries, err := e.ListFiles(ctx, id, "/workspace", true)
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
			r, err := e.ReadFile(ctx, FileReadRequest{SandboxID: id, Path: "/workspace/" + rel, MaxBytes: maxAgentFile})
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

// agentFixProvider is the autofix provider "agent": one fix = one agent
// session in the loop's own sandbox (the agent image, granted the
// credential), with the failure as its prompt. The session edits the
// files in place; its answer is the files it left, and the loop's success
// rule judges the next attempt as with any provider.
type agentFixProvider struct {
	e         *Engine
	sandboxID string // the loop's sandbox, set once it exists
	maxTurns  int
}

func (p *agentFixProvider) Name() string { return apitypes.ProviderAgent }

func (p *agentFixProvider) Fix(ctx context.Context, req *autofix.FixRequest) (*autofix.Answer, error) {
	if p.sandboxID == "" {
		return nil, errors.New("the loop has no sandbox")
	}
	timeout := defaultAgentTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= time.Second {
		return nil, context.DeadlineExceeded
	}
	prompt := req.Prompt() + "\n\nFix the project's files in /workspace in place (edit them; do not only explain), then run the failing step again to check."
	res, err := p.e.AgentRun(ctx, AgentRunRequest{Prompt: prompt, SandboxID: p.sandboxID, MaxTurns: p.maxTurns, TimeoutSeconds: timeout.Seconds()}, nil)
	if err != nil {
		return nil, err
	}
	if !res.Success && strings.HasPrefix(res.Cause, "spend_cap") {
		return nil, fmt.Errorf("agent session stopped: %s (transcript %s)", res.Cause, res.Transcript)
	}
	files := map[string]string{}
	for p := range req.Files {
		if c, ok := res.Files[p]; ok {
			files[p] = c
		}
	}
	for _, ch := range res.Changes {
		if c, ok := res.Files[ch.Path]; ok && ch.Status != "deleted" {
			files[ch.Path] = c
		}
	}
	return &autofix.Answer{Files: files, Usage: &apitypes.TokenUsage{InputTokens: res.Usage.InputTokens, OutputTokens: res.Usage.OutputTokens}}, nil
}
