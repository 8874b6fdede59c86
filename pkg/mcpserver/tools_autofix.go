package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/autofix"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

type autofixIn = apitypes.AutofixRequest

type autofixSubmitIn = apitypes.AutofixSubmitRequest

type autofixStatusIn struct {
	AutofixID string `json:"autofix_id" jsonschema_description:"The autofix_id of an autofix answer."`
}

type autofixOut = apitypes.AutofixResult

func (s *srv) addAutofixTools() {
	// Sampling (provider sampling) asks a client that declared the
	// capability for a completion. mcp-go's EnableSampling would only add a
	// "sampling" entry to the server's own capabilities, which the protocol
	// does not define for servers: it is left out (capabilities say what the
	// server offers).

	addTool[autofixIn, autofixOut](s, "autofix", "Run and fix until it works",
		joinLines(
			"Run a program and, while it fails, get a fix, apply it and run again, in one sandbox kept for the loop (no network unless asked). attempts counts runs: the original code is attempt 1. Stops on success, after max_retries fixes, at the timeout, when a fix changes nothing, or when the same code fails the same way twice.",
			"Providers: client (default unless the server says otherwise): no model on the server — the answer has status needs_fix, autofix_id, the error and a ready prompt; fix the code yourself and call autofix_submit {autofix_id, code or files}. sampling: the server asks your model through sampling/createMessage (falls back to client if you cannot sample). anthropic, command: the server's own fixer, if configured.",
			"Success rules: exit_zero_and_empty_stderr (default), exit_zero, tests (the language's test task, or test_command, must pass too). The run record (run_get) keeps every attempt's code, error and fix as a diff. With a progress token, each attempt is reported as a progress notification.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *autofixIn) (*result, error) {
			opts := s.autofixOptions(ctx, c)
			res, err := s.e.Autofix(ctx, *in, opts)
			if err != nil {
				return nil, err
			}
			return s.autofixResult(res), nil
		})

	addTool[autofixSubmitIn, autofixOut](s, "autofix_submit", "Submit a fix",
		joinLines(
			"Answer an autofix loop waiting at status needs_fix: give the entrypoint's new content (code), changed files ({path: content}; others stay), or answer (a unified diff or fenced blocks whose info string ends with the path). The server runs the next attempt and answers like autofix: fixed, failed, or needs_fix again with the new error and prompt.",
			"Prerequisite: autofix_id from an autofix answer with status needs_fix, before its expires_at. Sessions survive a server restart.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *autofixSubmitIn) (*result, error) {
			res, err := s.e.AutofixSubmit(ctx, *in, s.autofixOptions(ctx, c))
			if err != nil {
				return nil, err
			}
			return s.autofixResult(res), nil
		})

	addTool[autofixStatusIn, autofixOut](s, "autofix_status", "Show an autofix loop",
		"Show an autofix loop: its status (running, needs_fix, fixed, failed, expired), the attempts so far with their exit codes, error excerpts and fix summaries, the current files and the diff from the original.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *autofixStatusIn) (*result, error) {
			res, err := s.e.AutofixStatus(ctx, in.AutofixID)
			if err != nil {
				return nil, err
			}
			return s.autofixResult(res), nil
		})
}

// autofixOptions gives the loop the client's model when the client can
// sample, and reports each attempt as a progress notification.
func (s *srv) autofixOptions(ctx context.Context, c *call) engine.AutofixOptions {
	var opts engine.AutofixOptions
	if canSample(ctx) {
		opts.Sampling = &samplingProvider{srv: s.mcp, maxTokens: s.cfg.Autofix.MaxTokens}
	}
	meta := c.req.Params.Meta
	srv := server.ServerFromContext(ctx)
	if meta != nil && meta.ProgressToken != nil && srv != nil {
		token := meta.ProgressToken
		opts.OnEvent = func(ev apitypes.AutofixEvent) {
			if ev.Attempt == nil {
				return
			}
			_ = srv.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), apitypes.ProgressMessage{
				ProgressToken: token, Progress: ev.Attempt.Attempt, Message: attemptLine(ev.Type, ev.Attempt),
			}.Params())
		}
	}
	return opts
}

// canSample reports whether the calling client declared sampling (or is an
// in-process client with a sampling handler).
func canSample(ctx context.Context) bool {
	if server.InProcessSamplingHandlerFromContext(ctx) != nil {
		return true
	}
	sess, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo)
	return ok && sess.GetClientCapabilities().Sampling != nil
}

// samplingProvider asks the MCP client's model for fixes
// (sampling/createMessage) within the tool call.
type samplingProvider struct {
	srv       *server.MCPServer
	maxTokens int
}

func (p *samplingProvider) Name() string { return apitypes.ProviderSampling }

func (p *samplingProvider) Fix(ctx context.Context, req *autofix.FixRequest) (*autofix.Answer, error) {
	// Sampling is deprecated from protocol 2026-07-28 on, which has no
	// server-initiated requests; clients of earlier versions (Claude Code
	// among them) still sample, and later ones fall back to the client
	// provider (ErrUseClient).
	//lint:ignore SA1019 the issue asks for sampling; newer clients fall back to autofix_submit
	res, err := p.srv.RequestSampling(ctx, mcp.CreateMessageRequest{CreateMessageParams: mcp.CreateMessageParams{
		Messages: []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(req.Prompt())}},
		SystemPrompt: "You fix programs that fail. Answer only with code: the complete new content of each file you change " +
			"in a fenced code block whose info string is the language and the file's path, or a unified diff.",
		MaxTokens: p.maxTokens,
	}})
	if errors.Is(err, server.ErrServerInitiatedRequestUnsupported) {
		return nil, fmt.Errorf("sampling: %w: %w", err, autofix.ErrUseClient)
	}
	if err != nil {
		return nil, fmt.Errorf("sampling: %w", err)
	}
	text, ok := samplingText(res.Content)
	if !ok {
		return nil, errors.New("sampling: the client's answer has no text")
	}
	return &autofix.Answer{Text: text}, nil
}

// samplingText reads the text of a sampling answer's content, which a
// transport may hand over typed or as decoded JSON.
func samplingText(c any) (string, bool) {
	switch v := c.(type) {
	case mcp.TextContent:
		return v.Text, true
	case *mcp.TextContent:
		return v.Text, true
	case map[string]any:
		t, ok := v["text"].(string)
		return t, ok
	case []any:
		var b strings.Builder
		for _, part := range v {
			if t, ok := samplingText(part); ok {
				b.WriteString(t)
			}
		}
		return b.String(), b.Len() > 0
	}
	return "", false
}

func attemptLine(kind string, a *apitypes.AutofixAttempt) string {
	if kind == "fix" {
		return fmt.Sprintf("attempt %d: fix by %s: %s", a.Attempt, a.Provider, a.FixSummary)
	}
	if a.Success {
		return fmt.Sprintf("attempt %d: success (%s)", a.Attempt, termText(a.ExitCode, a.Termination, a.DurationMS))
	}
	return fmt.Sprintf("attempt %d: %s: %s", a.Attempt, termText(a.ExitCode, a.Termination, a.DurationMS), a.ErrorExcerpt)
}

// autofixResult shapes a loop's answer into the result budget: the last
// run's output is cut first.
func (s *srv) autofixResult(res *apitypes.AutofixResult) *result {
	where := fmt.Sprintf("the run record keeps it: run_get {run_id: %q}", res.RunID)
	return s.fit(func(limit int) *result {
		out := *res
		if res.LastResult != nil {
			lr := *res.LastResult
			lr.Steps = nil
			lo, le := split(limit/2, len(lr.Stdout), len(lr.Stderr))
			var c1, c2 bool
			lr.Stdout, c1 = cut(lr.Stdout, lo, where)
			lr.Stderr, c2 = cut(lr.Stderr, le, where)
			if c1 || c2 {
				out.Note = "output cut to fit the result; " + where
			}
			out.LastResult = &lr
		}
		var b strings.Builder
		fmt.Fprintf(&b, "autofix %s (%s, run %s): %s after %d attempt(s)", res.AutofixID, res.Language, res.RunID, res.Status, res.Attempts)
		if res.StopReason != "" && res.StopReason != apitypes.StopSuccess {
			fmt.Fprintf(&b, ", stopped: %s", res.StopReason)
		}
		if res.Error != "" {
			fmt.Fprintf(&b, " (%s)", res.Error)
		}
		b.WriteString("\n")
		for i := range res.History {
			a := &res.History[i]
			fmt.Fprintf(&b, "  %s\n", attemptLine("attempt", a))
			if a.FixSummary != "" {
				fmt.Fprintf(&b, "  %s\n", attemptLine("fix", a))
			}
		}
		if res.Status == apitypes.AutofixNeedsFix {
			fmt.Fprintf(&b, "\nFix the program and call autofix_submit {autofix_id: %q, code: ...} (or files). The request:\n\n", res.AutofixID)
			p, _ := cut(res.Prompt, limit, "")
			b.WriteString(p)
		} else if res.Diff != "" {
			d, _ := cut(res.Diff, limit/2, where)
			b.WriteString("--- diff (original → final) ---\n" + d)
		}
		return &result{structured: out, text: b.String()}
	})
}
