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
	if want := "exit 1\nnetwork: refused pkg.example.test; allowed during this call after your approval: pkg.example.test; an allowlist that lets this through: pkg.example.test"; r.text != want {
		t.Errorf("text %q, want %q", r.text, want)
	}
	// Approved only (the call went on after the yes): nothing refused.
	ok := &result{structured: apitypes.CommandResult{State: apitypes.JobFinished}, text: "exit 0"}
	attachRefusals(ok, &apitypes.NetworkRefusals{Refused: []string{}, Approved: []string{"pkg.example.test"}, ProposedAllow: []string{"pkg.example.test"}})
	if want := "exit 0\nnetwork: allowed during this call after your approval: pkg.example.test; an allowlist that lets this through: pkg.example.test"; ok.text != want {
		t.Errorf("text %q, want %q", ok.text, want)
	}
	run := &result{structured: apitypes.RunResult{RunID: "r"}}
	attachRefusals(run, rep)
	if v := run.structured.(apitypes.RunResult); v.NetworkRefusals != rep {
		t.Errorf("run result: %+v", v)
	}
}

// forwarder makes f's Exec and RunCode do what pkg/network's DNS
// forwarder does for a sandbox watched by the call: for each name, a
// refused lookup held while Approve (if any) decides, then Refused unless
// approved. It records each decision.
func forwarder(t *testing.T, f *fakeEngine, id string, names ...string) *[]bool {
	var decisions []bool
	f.execHook = func(ctx context.Context) {
		w, ok := engine.NetworkWatchFrom(ctx) // run_code's fresh sandbox
		if !ok {
			f.watchMu.Lock()
			w, ok = f.watches[id]
			f.watchMu.Unlock()
		}
		if !ok {
			t.Errorf("the call watches no sandbox")
			return
		}
		for _, name := range names {
			yes := false
			if w.Approve != nil {
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the hold
				yes = w.Approve(hctx, id, name)
				cancel()
			}
			decisions = append(decisions, yes)
			if !yes {
				w.Refused(name)
			}
		}
	}
	return &decisions
}

// stdioClient serves f over stdio to a line client that declares
// elicitation when elicit is set; the server's questions time out after
// timeout.
func stdioClient(t *testing.T, f *fakeEngine, elicit bool, timeout time.Duration) *lineClient {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- ServeStdio(context.Background(), f, Options{Log: testenv.Logger(t), ApprovalTimeout: timeout}, inR, outW)
	}()
	t.Cleanup(func() { inW.Close(); <-done })
	c := newLineClient(t, inW, outR)
	caps := map[string]any{}
	if elicit {
		caps["elicitation"] = map[string]any{"form": map[string]any{}}
	}
	c.request("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": caps, "clientInfo": map[string]any{"name": "line-client", "version": "0"}})
	c.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return c
}

// allowlistFake answers SandboxNetwork for an allowlist sandbox whose list
// starts as allow, recording each change; refused names are the
// forwarder's (the watch), not the status.
func allowlistFake(f *fakeEngine, allow ...string) *[][]string {
	var mu sync.Mutex
	var changes [][]string
	f.network = func(req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		if req.Mode != "" || req.Allow != nil {
			changes = append(changes, req.Allow)
			allow = slices.Clone(req.Allow)
		}
		return &apitypes.NetworkStatus{Mode: engine.NetworkAllowlist, Allow: slices.Clone(allow)}, nil
	}
	return &changes
}

func elicitations(c *lineClient) (msgs []string) {
	for _, m := range c.notifs {
		if m["method"] == "elicitation/create" {
			p, _ := m["params"].(map[string]any)
			msg, _ := p["message"].(string)
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

// TestApprovalDuringCall: the client is asked while the call runs (the
// fake forwarder's held lookup), its yes changes the allowlist before
// the command goes on, and the result says the host was allowed during
// the call (nothing left refused).
func TestApprovalDuringCall(t *testing.T) {
	const host = "pkg.example.test"
	f := newFake()
	changes := allowlistFake(f, "a.example.test")
	decisions := forwarder(t, f, "sb-1", host)
	c := stdioClient(t, f, true, 5*time.Second)
	c.answer = func(map[string]any) any {
		return map[string]any{"action": "accept", "content": map[string]any{"allow": true}}
	}
	res := c.callTool("exec_command", map[string]any{"sandbox_id": "sb-1", "command": "pip install x"})
	if !slices.Equal(*decisions, []bool{true}) {
		t.Fatalf("decisions during the call %v, want one yes", *decisions)
	}
	if msgs := elicitations(c); len(msgs) != 1 || !strings.Contains(msgs[0], "Allow "+host+" for sandbox sb-1?") {
		t.Fatalf("questions %q", msgs)
	}
	if len(*changes) != 1 || !slices.Equal((*changes)[0], []string{"a.example.test", host}) {
		t.Fatalf("policy changes %q", *changes)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	rep, _ := sc["network_refusals"].(map[string]any)
	if res["isError"] == true || rep == nil || fmt.Sprint(rep["refused"]) != "[]" || fmt.Sprint(rep["approved"]) != "["+host+"]" ||
		fmt.Sprint(rep["proposed_allow"]) != "[a.example.test "+host+"]" {
		t.Fatalf("result %v", res)
	}
	text := fmt.Sprint(res["content"])
	if !strings.Contains(text, "network: allowed during this call after your approval: "+host) || strings.Contains(text, "network: refused") {
		t.Errorf("text %s", text)
	}
}

// TestApprovalBounds: of many refused names in one call, at most
// maxApprovalsPerCall are asked about (the rest refused at once), names
// that are not host names never, and every refusal is reported.
func TestApprovalBounds(t *testing.T) {
	f := newFake()
	allowlistFake(f)
	names := []string{"bad name.test", "a.test", "b.test", "-x.test", "c.test", "d.test", "e.test", "f.test", strings.Repeat("l", 64) + ".test"}
	decisions := forwarder(t, f, "sb-1", names...)
	c := stdioClient(t, f, true, 5*time.Second)
	c.answer = func(map[string]any) any { return map[string]any{"action": "decline"} }
	res := c.callTool("exec_command", map[string]any{"sandbox_id": "sb-1", "command": "curl many"})
	msgs := elicitations(c)
	if len(msgs) != maxApprovalsPerCall {
		t.Fatalf("%d questions, want %d: %q", len(msgs), maxApprovalsPerCall, msgs)
	}
	for i, h := range []string{"a.test", "b.test", "c.test", "d.test"} {
		if !strings.Contains(msgs[i], "Allow "+h+" for") {
			t.Errorf("question %d: %q, want %s", i, msgs[i], h)
		}
	}
	if slices.Contains(*decisions, true) {
		t.Errorf("a decline approved: %v", *decisions)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	rep, _ := sc["network_refusals"].(map[string]any)
	refused, _ := rep["refused"].([]any)
	if len(refused) != len(names) || rep["approved"] != nil {
		t.Fatalf("report %v, want all %d refused", rep, len(names))
	}
}

// TestApprovalWithoutElicitation: a client that did not declare
// elicitation is never asked and its lookups are not held (the watch has
// no Approve); the refusal is reported as before.
func TestApprovalWithoutElicitation(t *testing.T) {
	f := newFake()
	changes := allowlistFake(f, "a.example.test")
	decisions := forwarder(t, f, "sb-1", "pkg.example.test")
	c := stdioClient(t, f, false, 5*time.Second)
	start := time.Now()
	res := c.callTool("exec_command", map[string]any{"sandbox_id": "sb-1", "command": "pip install x"})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the call took %v", d)
	}
	if len(elicitations(c)) != 0 || len(*changes) != 0 || !slices.Equal(*decisions, []bool{false}) {
		t.Fatalf("asked %d, changes %q, decisions %v", len(elicitations(c)), *changes, *decisions)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	rep, _ := sc["network_refusals"].(map[string]any)
	if fmt.Sprint(rep["refused"]) != "[pkg.example.test]" || fmt.Sprint(rep["proposed_allow"]) != "[a.example.test pkg.example.test]" {
		t.Fatalf("report %v", rep)
	}
}

// TestApprovalFreshRun: run_code without sandbox_id hands the engine a
// watch in its context (the fresh sandbox's id is the engine's to know);
// a yes there is reported in the run's result.
func TestApprovalFreshRun(t *testing.T) {
	const host = "pkg.example.test"
	f := newFake()
	changes := allowlistFake(f)
	decisions := forwarder(t, f, "sb-fresh", host)
	c := stdioClient(t, f, true, 5*time.Second)
	c.answer = func(map[string]any) any {
		return map[string]any{"action": "accept", "content": map[string]any{"allow": true}}
	}
	res := c.callTool("run_code", map[string]any{"language": "python", "code": "import greetpkg", "network": "allowlist"})
	if !slices.Equal(*decisions, []bool{true}) || len(*changes) != 1 || !slices.Equal((*changes)[0], []string{host}) {
		t.Fatalf("decisions %v, changes %q", *decisions, *changes)
	}
	if msgs := elicitations(c); len(msgs) != 1 || !strings.Contains(msgs[0], "Allow "+host+" for sandbox sb-fresh?") {
		t.Fatalf("questions %q", msgs)
	}
	sc, _ := res["structuredContent"].(map[string]any)
	rep, _ := sc["network_refusals"].(map[string]any)
	if fmt.Sprint(rep["approved"]) != "["+host+"]" || fmt.Sprint(rep["proposed_allow"]) != "["+host+"]" {
		t.Fatalf("run result %v", sc)
	}
}

// TestApprovalUnanswered: over stdio, a client that declared elicitation
// but never answers is asked once, during the call, the call's result
// comes after the timeout with the host still refused (no policy
// change), and a second call refused the same host in the same sandbox
// does not ask again.
func TestApprovalUnanswered(t *testing.T) {
	const host = "pkg.example.test"
	f := newFake()
	forwarder(t, f, "sb-1", host)
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
