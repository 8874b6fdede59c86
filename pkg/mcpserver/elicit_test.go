package mcpserver

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// TestApprovalWindow: a host is asked about once per sandbox within the
// window, again after it, and independently in another sandbox.
func TestApprovalWindow(t *testing.T) {
	var a approvals
	now := time.Unix(1_000_000, 0)
	if !a.first("sb-1", "pkg.example.test", now) {
		t.Fatal("first question refused")
	}
	if a.first("sb-1", "pkg.example.test", now.Add(approvalWindow-time.Second)) {
		t.Error("asked twice within the window")
	}
	if !a.first("sb-2", "pkg.example.test", now.Add(time.Second)) {
		t.Error("another sandbox was not asked")
	}
	if !a.first("sb-1", "other.example.test", now.Add(time.Second)) {
		t.Error("another host was not asked")
	}
	if !a.first("sb-1", "pkg.example.test", now.Add(approvalWindow+time.Second)) {
		t.Error("not asked again after the window")
	}
}

// TestNewRefusals: only names new since before, once each, never
// addresses.
func TestNewRefusals(t *testing.T) {
	got := newRefusals([]string{"old.example.test", "203.0.113.9"},
		[]string{"old.example.test", "203.0.113.10", "pkg.example.test", "pkg.example.test", "2001:db8::1", "deb.example.test"})
	if want := []string{"pkg.example.test", "deb.example.test"}; !slices.Equal(got, want) {
		t.Fatalf("newRefusals = %q, want %q", got, want)
	}
	if got := newRefusals([]string{"a.test"}, []string{"a.test"}); got != nil {
		t.Fatalf("nothing new: %q", got)
	}
}

// TestApprovedAnswers: hostile or partial answers are a no.
func TestApprovedAnswers(t *testing.T) {
	res := func(action mcp.ElicitationResponseAction, content any) *mcp.ElicitationResult {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: action, Content: content}}
	}
	for _, c := range []struct {
		name string
		res  *mcp.ElicitationResult
		want bool
	}{
		{"yes", res(mcp.ElicitationResponseActionAccept, map[string]any{"allow": true}), true},
		{"accept with false", res(mcp.ElicitationResponseActionAccept, map[string]any{"allow": false}), false},
		{"accept with a string", res(mcp.ElicitationResponseActionAccept, map[string]any{"allow": "true"}), false},
		{"accept without content", res(mcp.ElicitationResponseActionAccept, nil), false},
		{"accept with a list", res(mcp.ElicitationResponseActionAccept, []any{true}), false},
		{"decline with allow", res(mcp.ElicitationResponseActionDecline, map[string]any{"allow": true}), false},
		{"cancel", res(mcp.ElicitationResponseActionCancel, nil), false},
		{"unknown action", res("allow", map[string]any{"allow": true}), false},
		{"no answer", nil, false},
	} {
		if got := approved(c.res); got != c.want {
			t.Errorf("%s: approved = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestAttachRefusals: the report reaches both the structured content and
// the text, for commands and runs.
func TestAttachRefusals(t *testing.T) {
	rep := &apitypes.NetworkRefusals{Refused: []string{"pkg.example.test"}, Approved: []string{"pkg.example.test"}, ProposedAllow: []string{"pkg.example.test"}}
	r := &result{structured: apitypes.CommandResult{State: apitypes.JobFinished}, text: "exit 1"}
	attachRefusals(r, rep)
	if c := r.structured.(apitypes.CommandResult); c.NetworkRefusals != rep {
		t.Errorf("command result: %+v", c)
	}
	if want := "exit 1\nnetwork: refused pkg.example.test; allowed now after your approval: pkg.example.test (run again); an allowlist that lets this through: pkg.example.test"; r.text != want {
		t.Errorf("text %q, want %q", r.text, want)
	}
	run := &result{structured: apitypes.RunResult{RunID: "r"}}
	attachRefusals(run, rep)
	if v := run.structured.(apitypes.RunResult); v.NetworkRefusals != rep {
		t.Errorf("run result: %+v", v)
	}
}

// TestApprovalUnanswered: over stdio, a client that declared elicitation
// but never answers is asked once, the call's result comes after the
// timeout with the host still refused (no policy change), and a second
// call refused the same host in the same sandbox does not ask again.
func TestApprovalUnanswered(t *testing.T) {
	const host = "pkg.example.test"
	f := newFake()
	var mu sync.Mutex
	statuses, changes := 0, 0
	f.network = func(req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		if req.Mode != "" || req.Allow != nil {
			changes++
			return &apitypes.NetworkStatus{Mode: engine.NetworkAllowlist, Allow: req.Allow}, nil
		}
		// Before each call nothing was refused, after it host was.
		statuses++
		st := &apitypes.NetworkStatus{Mode: engine.NetworkAllowlist, Allow: []string{"a.example.test"}}
		if statuses%2 == 0 {
			st.Counters.DeniedDestinations = []string{host, "203.0.113.10"}
		}
		return st, nil
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- ServeStdio(context.Background(), f, Options{Log: testenv.Logger(t), ApprovalTimeout: 200 * time.Millisecond}, inR, outW)
	}()
	defer func() { inW.Close(); <-done }()
	c := newLineClient(t, inW, outR)
	c.request("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}, "clientInfo": map[string]any{"name": "line-client", "version": "0"}})
	c.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})

	asked := func() (n int) {
		for _, m := range c.notifs {
			if m["method"] == "elicitation/create" {
				n++
				p, _ := m["params"].(map[string]any)
				if msg, _ := p["message"].(string); !strings.Contains(msg, "Allow "+host+" for sandbox sb-1?") {
					t.Errorf("elicitation message %q", msg)
				}
			}
		}
		return n
	}
	for i := range 2 {
		c.notifs = nil
		start := time.Now()
		res := c.callTool("exec_command", map[string]any{"sandbox_id": "sb-1", "command": "pip install x"})
		sc, _ := res["structuredContent"].(map[string]any)
		rep, _ := sc["network_refusals"].(map[string]any)
		if res["isError"] == true || rep == nil || fmt.Sprint(rep["refused"]) != "["+host+"]" || rep["approved"] != nil ||
			fmt.Sprint(rep["proposed_allow"]) != "[a.example.test "+host+"]" {
			t.Fatalf("call %d: %v", i, res)
		}
		want := 1
		if i == 1 {
			want = 0 // asked within the window already
		}
		if n := asked(); n != want {
			t.Errorf("call %d: asked %d times, want %d", i, n, want)
		}
		if i == 0 && time.Since(start) < 200*time.Millisecond {
			t.Errorf("the result came before the approval timed out (%v)", time.Since(start))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if changes != 0 {
		t.Errorf("%d policy changes without a yes", changes)
	}
}
