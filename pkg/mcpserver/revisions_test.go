package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// startStdio serves one stdio session with the engine in-process, as
// `mcp-sandboxd stdio` does without a daemon, and returns a client on it.
func startStdio(t *testing.T, opt Options) (*lineClient, func()) {
	t.Helper()
	e := newEngine(t)
	if opt.Log == nil {
		opt.Log = testenv.Logger(t)
	}
	// As cmd/mcp-sandboxd/stdio.go wires it.
	if opt.Replays == nil {
		opt.Replays = e.Replays()
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeStdio(context.Background(), e, opt, inR, outW) }()
	end := func() {
		inW.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeStdio: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("ServeStdio did not return at the end of its input")
		}
	}
	return newLineClient(t, inW, outR), end
}

// modernMeta is the _meta every 2026-07-28 request carries instead of an
// initialize handshake.
func modernMeta(extra map[string]any) map[string]any {
	m := map[string]any{
		mcp.MetaKeyProtocolVersion:    mcp.ProtocolVersion20260728,
		mcp.MetaKeyClientInfo:         map[string]any{"name": "line-client", "version": "0"},
		mcp.MetaKeyClientCapabilities: map[string]any{},
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// TestStdioEveryRevision speaks every protocol revision mcp-go serves over
// stdio (the bridge in front of the HTTP handler): list the tools, run a
// command with a progress token, and get its progress before its result.
// 2026-07-28 has no initialize and needs Mcp-Method/Mcp-Name headers on
// the HTTP side, which the bridge must add.
func TestStdioEveryRevision(t *testing.T) {
	c, end := startStdio(t, Options{ProgressInterval: time.Second})
	defer end()
	for _, v := range mcp.ValidProtocolVersions {
		t.Run(v, func(t *testing.T) {
			c.t = t
			meta := func(extra map[string]any) map[string]any { return extra }
			if mcp.IsModernProtocol(v) {
				meta = modernMeta
			} else {
				// A new session per legacy revision: restart the line
				// client's session by initializing with v.
				res := c.request("initialize", map[string]any{"protocolVersion": v,
					"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "line-client", "version": "0"}})
				if res["protocolVersion"] != v {
					t.Fatalf("initialize %s agreed %v", v, res["protocolVersion"])
				}
				// Capabilities say what the server offers, nothing more.
				caps, _ := res["capabilities"].(map[string]any)
				tasks, _ := caps["tasks"].(map[string]any)
				if len(caps) != 3 || caps["tools"] == nil || caps["resources"] == nil ||
					!strings.Contains(fmt.Sprint(tasks["requests"]), "tools:map[call:map[]]") || tasks["cancel"] == nil {
					t.Errorf("capabilities %v, want tools, resources and tasks (tools/call, cancel)", caps)
				}
				c.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
			}
			tools := c.request("tools/list", map[string]any{"_meta": meta(nil)})["tools"].([]any)
			if len(tools) != len(allTools) {
				t.Errorf("%d tools", len(tools))
			}
			res := c.request("tools/call", map[string]any{"name": "languages_list", "arguments": map[string]any{}, "_meta": meta(nil)})
			if res["isError"] == true || !strings.Contains(fmt.Sprint(res["structuredContent"]), "python") {
				t.Errorf("languages_list: %v", res)
			}
			c.notifs = nil
			res = c.request("tools/call", map[string]any{"name": "run_code",
				"arguments": map[string]any{"language": "shell", "code": "echo one; sleep 2.5; echo two"},
				"_meta":     meta(map[string]any{"progressToken": "tok-" + v})})
			sc, _ := res["structuredContent"].(map[string]any)
			if res["isError"] == true || sc["stdout"] != "one\ntwo\n" {
				t.Fatalf("run_code: %v", res)
			}
			var msgs []string
			for _, n := range c.notifs {
				p, _ := n["params"].(map[string]any)
				if n["method"] == string(mcp.MethodNotificationProgress) && p["progressToken"] == "tok-"+v {
					msgs = append(msgs, fmt.Sprint(p["message"]))
				}
			}
			all := strings.Join(msgs, "")
			// Output as it comes, and heartbeats (1 s here) in the silence.
			if !strings.Contains(all, "one\n") || !strings.Contains(all, "still running") {
				t.Errorf("progress before the result: %q", msgs)
			}
		})
	}
	c.t = t
}

// TestStdioOrdering runs many calls with progress at once on one stdio
// session: every progress notification of a request is written before
// that request's result, none after it.
func TestStdioOrdering(t *testing.T) {
	e := newEngine(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeStdio(context.Background(), e, Options{Log: testenv.Logger(t)}, inR, outW) }()
	defer func() { inW.Close(); <-done }()
	c := newLineClient(t, inW, outR)
	c.initialize()
	id := c.callTool("sandbox_create", map[string]any{"language": "shell"})["structuredContent"].(map[string]any)["sandbox_id"].(string)

	const calls = 500
	var wmu sync.Mutex
	send := func(msg map[string]any) {
		b, _ := json.Marshal(msg)
		wmu.Lock()
		defer wmu.Unlock()
		if _, err := inW.Write(append(b, '\n')); err != nil {
			t.Error(err)
		}
	}
	// At most window calls in flight, like an agent running tools in
	// parallel.
	const window = 8
	slots := make(chan struct{}, window)
	go func() {
		for i := range calls {
			slots <- struct{}{}
			send(map[string]any{"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/call", "params": map[string]any{
				"name": "exec_command", "arguments": map[string]any{"sandbox_id": id, "command": fmt.Sprintf("echo a%d; echo b%d", i, i)},
				"_meta": map[string]any{"progressToken": fmt.Sprintf("p%d", i)}}})
		}
	}()
	answered := map[string]bool{}
	progress := 0
	seen := map[string]bool{}
	r := bufio.NewReaderSize(outR, 1<<20)
	for len(answered) < calls {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Token any `json:"progressToken"`
			} `json:"params"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		switch {
		case m.Method == string(mcp.MethodNotificationProgress):
			tok := fmt.Sprint(m.Params.Token)
			if answered[tok] {
				t.Errorf("progress for %s after its result", tok)
			}
			progress++
			seen[tok] = true
		case m.Method == "":
			if strings.Contains(string(line), `"isError":true`) || strings.Contains(string(line), `"error":`) {
				t.Errorf("call failed: %s", line)
			}
			var n int
			fmt.Sscan(string(m.ID), &n)
			<-slots
			answered[fmt.Sprintf("p%d", n-1000)] = true
		}
	}
	// Output that comes right before the exit travels in the result only
	// (progressSettle), so not every call has progress; most do.
	if len(seen) < calls/4 {
		var missing []string
		for i := range calls {
			if tok := fmt.Sprintf("p%d", i); !seen[tok] {
				missing = append(missing, tok)
			}
		}
		t.Errorf("%d progress notifications for %d calls; none for %v", progress, calls, missing)
	}
	t.Logf("%d calls, %d progress notifications, none after its result", calls, progress)
}
