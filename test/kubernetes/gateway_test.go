//go:build kubernetes

package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// The checks through the gateway's Service, in two phases that
// scripts/test-kubernetes.sh runs around `kubectl delete pod` of the node
// daemon: TestGatewayServes creates a sandbox and uses it, and leaves its
// id and a file's content in KUBE_TEST_STATE; TestGatewayAfterAdoption,
// once the DaemonSet's new pod is up, finds the same sandbox through the
// gateway and uses it again. Every call goes to the gateway Service's
// cluster address (kube-proxy spreads them over the gateway replicas),
// never to the node daemon.
//
// Between the two phases, TestGatewayMCP and TestGatewayE2B drive the
// official MCP and E2B SDKs (test/mcp/gateway.mjs, test/e2b/client.mjs)
// through the same Service.

// gatewayEnv reads what the script passes.
type gatewayEnv struct {
	url, token, node, state string
}

func readGatewayEnv(t *testing.T) gatewayEnv {
	t.Helper()
	e := gatewayEnv{os.Getenv("KUBE_TEST_GATEWAY_URL"), os.Getenv("KUBE_TEST_ADMIN_TOKEN"), os.Getenv("KUBE_TEST_NODE"), os.Getenv("KUBE_TEST_STATE")}
	if e.url == "" || e.token == "" || e.node == "" || e.state == "" {
		t.Fatal("run by scripts/test-kubernetes.sh: KUBE_TEST_GATEWAY_URL, _ADMIN_TOKEN, _NODE, _STATE unset")
	}
	return e
}

func (e gatewayEnv) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: e.url, Token: e.token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestGatewayServes(t *testing.T) {
	e := readGatewayEnv(t)
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The gateway found the DaemonSet's daemon through the Kubernetes API
	// (its ServiceAccount, the chart's Role) and reached it.
	nodes, err := c.Nodes(ctx)
	if err != nil {
		t.Fatalf("GET /v1/nodes through the gateway: %v", err)
	}
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Name != e.node || !nodes.Nodes[0].Reachable {
		t.Fatalf("gateway's nodes %+v: want %s alone, reachable", nodes.Nodes, e.node)
	}

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Language: "shell"})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	id := sb.ID
	if tag, ok := sandbox.IDNodeTag(id); !ok || tag != sandbox.NodeTag(e.node) {
		t.Fatalf("sandbox id %s: node tag %q (ok %v), want node %s's %q", id, tag, ok, e.node, sandbox.NodeTag(e.node))
	}

	// A REST exec whose output streams: the first line reaches us while
	// the command still sleeps, well before its exit line.
	start := time.Now()
	var firstAt time.Duration
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "echo one; sleep 2; echo two >&2; echo three"}, func(stream string, data []byte) {
		if firstAt == 0 && stream == "stdout" && bytes.Contains(data, []byte("one")) {
			firstAt = time.Since(start)
		}
	})
	if err != nil {
		t.Fatalf("exec through the gateway: %v", err)
	}
	total := time.Since(start)
	if res.ExitCode != 0 || res.Stdout != "one\nthree\n" || res.Stderr != "two\n" {
		t.Fatalf("exec through the gateway: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if firstAt == 0 || total-firstAt < time.Second {
		t.Fatalf("exec output not streamed through the gateway: first line after %v, end after %v", firstAt, total)
	}
	t.Logf("exec streamed: first line after %v, end after %v", firstAt.Round(time.Millisecond), total.Round(time.Millisecond))

	// Files: upload, list, read back.
	mark := randomHex(t)
	if _, err := c.WriteFile(ctx, id, "/workspace/k8s.txt", 0, false, int64(len(mark)), strings.NewReader(mark)); err != nil {
		t.Fatalf("write a file through the gateway: %v", err)
	}
	entries, err := c.ListFiles(ctx, id, "/workspace", false)
	if err != nil {
		t.Fatalf("list files through the gateway: %v", err)
	}
	found := false
	for _, f := range entries {
		found = found || path.Base(f.Path) == "k8s.txt" && f.Size == int64(len(mark))
	}
	if !found {
		t.Fatalf("files of /workspace through the gateway: %+v, no k8s.txt of %d bytes", entries, len(mark))
	}
	if got := readFile(ctx, t, c, id, "/workspace/k8s.txt"); got != mark {
		t.Fatalf("read back through the gateway: %q, wrote %q", got, mark)
	}

	terminal(ctx, t, c, id)

	list, err := c.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatalf("list through the gateway: %v", err)
	}
	listed := false
	for _, s := range list {
		listed = listed || s.ID == id
	}
	if !listed {
		t.Fatalf("gateway's list %+v lacks %s", list, id)
	}
	if err := os.WriteFile(e.state, []byte(id+" "+mark), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestGatewayAfterAdoption(t *testing.T) {
	e := readGatewayEnv(t)
	c := e.client(t)
	b, err := os.ReadFile(e.state)
	if err != nil {
		t.Fatalf("TestGatewayServes's state: %v", err)
	}
	id, mark, _ := strings.Cut(string(b), " ")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The gateways learn of the new pod from its EndpointSlice: until then
	// they answer unavailable, which is the contract for a restarting node
	// (never not_found). Bounded.
	deadline := time.Now().Add(90 * time.Second)
	for {
		d, err := c.GetSandbox(ctx, id)
		if err == nil && (d.State == apitypes.StateReady || d.State == apitypes.StateRunning) {
			break
		}
		if err != nil && !errdefs.Is(err, errdefs.Unavailable) {
			t.Fatalf("sandbox %s through the gateway after the node daemon's pod was replaced: %v (want live, or unavailable for a while)", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s through the gateway: not live 90s after the new pod was ready: %+v, %v", id, d, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "cat /workspace/k8s.txt"}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != mark {
		t.Fatalf("exec in the adopted sandbox through the gateway: %+v, %v; want %q", res, err, mark)
	}
	if got := readFile(ctx, t, c, id, "/workspace/k8s.txt"); got != mark {
		t.Fatalf("file of the adopted sandbox through the gateway: %q, want %q", got, mark)
	}
	terminal(ctx, t, c, id)

	if _, err := c.TerminateSandbox(ctx, id); err != nil {
		t.Fatalf("terminate through the gateway: %v", err)
	}
	d, err := c.GetSandbox(ctx, id)
	if err != nil || d.State != apitypes.StateTerminated {
		t.Fatalf("after terminate through the gateway: %+v, %v", d, err)
	}
}

// terminal runs a shell on a pseudo-terminal over the WebSocket that the
// gateway upgrades and relays: a typed command's output comes back and
// the shell's own exit code ends it.
func terminal(ctx context.Context, t *testing.T, c *client.Client, id string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	term, err := c.OpenTerminal(tctx, id, client.TerminalRequest{Argv: []string{"/bin/sh"}, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatalf("terminal through the gateway: %v", err)
	}
	defer term.Close()
	if _, err := term.Write([]byte("echo term-$((6*7)); exit 3\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for b := range term.Output() {
		out.Write(b)
	}
	res, err := term.Wait()
	if err != nil {
		t.Fatalf("terminal through the gateway: %v (output %q)", err, out.String())
	}
	// "term-42" appears only in the output, not in the echoed input line.
	if res.ExitCode != 3 || !strings.Contains(out.String(), "term-42") {
		t.Fatalf("terminal through the gateway: exit %d, output %q; want 3 and term-42", res.ExitCode, out.String())
	}
}

func readFile(ctx context.Context, t *testing.T, c *client.Client, id, file string) string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := c.ReadFile(ctx, id, file, 0, 0, &buf); err != nil {
		t.Fatalf("read %s through the gateway: %v", file, err)
	}
	return buf.String()
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(errors.Join(errors.New("random mark"), err))
	}
	return hex.EncodeToString(b)
}

// clientsEnv is what the clients' phases need besides gatewayEnv: the
// gateway Service's E2B address, the node daemon's own address (to ask the
// node itself what it holds) and the repository, whose test/mcp and
// test/e2b hold the official SDKs (installed by scripts/install-deps.sh).
type clientsEnv struct {
	gatewayEnv
	e2bURL, nodeURL, repo string
}

func readClientsEnv(t *testing.T) clientsEnv {
	t.Helper()
	e := clientsEnv{readGatewayEnv(t), os.Getenv("KUBE_TEST_E2B_URL"), os.Getenv("KUBE_TEST_NODE_URL"), os.Getenv("KUBE_TEST_REPO")}
	if e.e2bURL == "" || e.nodeURL == "" || e.repo == "" {
		t.Fatal("run by scripts/test-kubernetes.sh: KUBE_TEST_E2B_URL, _NODE_URL, _REPO unset")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	return e
}

// onNode checks that sandbox id carries the DaemonSet's node's tag and
// that the node daemon itself (not a gateway) lists it live.
func (e clientsEnv) onNode(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	if tag, ok := sandbox.IDNodeTag(id); !ok || tag != sandbox.NodeTag(e.node) {
		t.Fatalf("sandbox id %s: node tag %q (ok %v), want node %s's %q", id, tag, ok, e.node, sandbox.NodeTag(e.node))
	}
	nc, err := client.New(client.Options{URL: e.nodeURL, Token: e.token})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	list, err := nc.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatalf("the node daemon's own list: %v", err)
	}
	for _, s := range list {
		if s.ID == id {
			if s.State != apitypes.StateReady && s.State != apitypes.StateRunning {
				t.Fatalf("the node daemon lists %s as %s, want it live", id, s.State)
			}
			return
		}
	}
	t.Fatalf("the node daemon at %s does not list %s", e.nodeURL, id)
}

// runNode runs `node script args...` in dir (an SDK's directory) and
// decodes its one JSON report into v; a "fatal" in it fails the test.
func runNode(ctx context.Context, t *testing.T, dir string, env []string, v any, args ...string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		t.Fatalf("%s has no node_modules: run scripts/install-deps.sh", dir)
	}
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var fatal struct {
		Fatal  string   `json:"fatal"`
		Errors []string `json:"errors"`
	}
	_ = json.Unmarshal(stdout.Bytes(), &fatal)
	if err != nil || fatal.Fatal != "" || len(fatal.Errors) > 0 {
		t.Fatalf("node %s: %v\n%s %v\nstdout: %.2000s\nstderr: %.2000s", args[0], err, fatal.Fatal, fatal.Errors, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatalf("node %s: report %.2000q: %v", args[0], stdout.String(), err)
	}
	return stdout.String()
}

// TestGatewayMCP: the official MCP TypeScript SDK over Streamable HTTP with
// the bearer key, at the gateway Service's /mcp: a Python sandbox created
// and run_code of Python in it, served by the DaemonSet's node daemon.
// Session affinity (the chart's ClientIP) keeps the session's requests on
// the replica that holds it, whichever kube-proxy picked first.
func TestGatewayMCP(t *testing.T) {
	e := readClientsEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec, _ := json.Marshal(map[string]any{"url": e.url + "/mcp", "token": e.token, "calls": []map[string]any{
		{"name": "sandbox_create", "args": map[string]any{"language": "python"}},
		{"name": "run_code", "args": map[string]any{"sandbox_id": "$sandbox", "language": "python",
			"code": "import sys\nprint(sum(range(10)), sys.version_info[0])\nprint('warn', file=sys.stderr)\n"}},
	}})
	var rep struct {
		Tools   []string `json:"tools"`
		Results []struct {
			Name       string         `json:"name"`
			MS         float64        `json:"ms"`
			IsError    bool           `json:"isError"`
			Text       string         `json:"text"`
			Structured map[string]any `json:"structured"`
		} `json:"results"`
	}
	runNode(ctx, t, filepath.Join(e.repo, "test", "mcp"), nil, &rep, "gateway.mjs", string(spec))
	if !slices.Contains(rep.Tools, "run_code") || !slices.Contains(rep.Tools, "sandbox_create") {
		t.Fatalf("tools through the gateway: %v", rep.Tools)
	}
	if len(rep.Results) != 2 || rep.Results[0].IsError || rep.Results[1].IsError {
		t.Fatalf("MCP calls through the gateway: %+v", rep.Results)
	}
	id, _ := rep.Results[0].Structured["sandbox_id"].(string)
	run := rep.Results[1].Structured
	if run["success"] != true || run["stdout"] != "45 3\n" || run["stderr"] != "warn\n" || run["sandbox_id"] != id {
		t.Fatalf("run_code of Python through the gateway: %v (sandbox %s)", run, id)
	}
	e.onNode(ctx, t, id)
	t.Logf("MCP through the gateway: sandbox_create %.0f ms, run_code %.0f ms, on %s", rep.Results[0].MS, rep.Results[1].MS, e.node)
	if _, err := e.client(t).TerminateSandbox(ctx, id); err != nil {
		t.Fatalf("terminate %s through the gateway: %v", id, err)
	}
}

// TestGatewayE2B: the official E2B SDK against the gateway Service's E2B
// port (control plane and envd, header routing): Sandbox.create,
// commands.run (streamed), a file written and read, list and kill; the
// sandbox lives on the DaemonSet's node daemon while it runs.
func TestGatewayE2B(t *testing.T) {
	e := readClientsEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// client.mjs's "gateway" flow (test/e2e runs the same against a
	// fleet): it kills its sandbox at the end, so the node is asked for
	// that sandbox's record afterwards — it holds it, terminated.
	env := []string{"E2B_API_KEY=" + e.token, "E2B_API_URL=" + e.e2bURL, "E2B_SANDBOX_URL=" + e.e2bURL, "E2B_DOMAIN=e2b.test"}
	var rep struct {
		SandboxID string `json:"sandboxId"`
		Run       struct {
			Stdout, Stderr string
			ExitCode       int
		} `json:"run"`
		Streamed         int     `json:"streamed"`
		StreamSpreadMs   float64 `json:"streamSpreadMs"`
		ReadText         string  `json:"readText"`
		Listed           bool    `json:"listed"`
		Killed           bool    `json:"killed"`
		RunningAfterKill bool    `json:"runningAfterKill"`
	}
	out := runNode(ctx, t, filepath.Join(e.repo, "test", "e2b"), env, &rep, "client.mjs", "gateway")
	t.Logf("E2B SDK through the gateway: %s", out)
	id := "sb-" + strings.TrimPrefix(rep.SandboxID, "sb")
	if tag, ok := sandbox.IDNodeTag(id); !ok || tag != sandbox.NodeTag(e.node) {
		t.Errorf("E2B sandbox %s: node tag %q (ok %v), want node %s's", rep.SandboxID, tag, ok, e.node)
	}
	if rep.Run.Stdout != "hello-42\n" || rep.Run.Stderr != "oops\n" || rep.Run.ExitCode != 0 {
		t.Errorf("commands.run through the gateway: %+v", rep.Run)
	}
	if rep.Streamed < 3 || rep.StreamSpreadMs < 500 {
		t.Errorf("a streamed command through the gateway: %d chunks over %.0f ms, want 3 over about 800", rep.Streamed, rep.StreamSpreadMs)
	}
	if rep.ReadText != "through the gateway" || !rep.Listed || !rep.Killed || rep.RunningAfterKill {
		t.Errorf("E2B files, list and kill through the gateway: %+v", rep)
	}
	nc, err := client.New(client.Options{URL: e.nodeURL, Token: e.token})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if d, err := nc.GetSandbox(ctx, id); err != nil || d.State != apitypes.StateTerminated {
		t.Errorf("the node daemon's own record of the E2B sandbox %s: %+v, %v; want it there, terminated by the kill", id, d, err)
	}
}
