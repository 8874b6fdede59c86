package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// mcpCall is one tool call of test/mcp/gateway.mjs; an argument "$sandbox"
// is the session's last created sandbox.
type mcpCall struct {
	Name string         `json:"name"`
	Args map[string]any `json:"args"`
	// Progress asks for progress notifications (exec output as it comes).
	Progress bool `json:"progress,omitempty"`
}

// mcpResult is a call's answer as the TypeScript SDK saw it.
type mcpResult struct {
	Name     string  `json:"name"`
	MS       float64 `json:"ms"`
	Progress []struct {
		MS      float64 `json:"ms"`
		Message string  `json:"message"`
	} `json:"progress"`
	Args       map[string]any `json:"args"`
	IsError    bool           `json:"isError"`
	Text       string         `json:"text"`
	Structured map[string]any `json:"structured"`
}

// gatewayMJS runs test/mcp/gateway.mjs with spec in the fabric namespace,
// where the gateways listen, and decodes its report into v.
func (f *fleet) gatewayMJS(spec any, v any) {
	f.t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		f.t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	b, _ := json.Marshal(spec)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+f.fabricName, "--", "node", "gateway.mjs", string(b))
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "mcp")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var fatal struct {
		Fatal  string   `json:"fatal"`
		Errors []string `json:"errors"`
	}
	_ = json.Unmarshal(stdout.Bytes(), &fatal)
	if err != nil || fatal.Fatal != "" || len(fatal.Errors) > 0 {
		f.t.Fatalf("node gateway.mjs: %v\n%s\n%v\nstderr: %s", err, fatal.Fatal, fatal.Errors, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		f.t.Fatalf("gateway.mjs report %.2000q: %v", stdout.String(), err)
	}
}

// mcpSession makes calls in one MCP session through url with key.
func (f *fleet) mcpSession(url, key string, calls ...mcpCall) []mcpResult {
	f.t.Helper()
	var rep struct {
		Tools   []string    `json:"tools"`
		Results []mcpResult `json:"results"`
	}
	f.gatewayMJS(map[string]any{"url": url, "token": key, "calls": calls}, &rep)
	if !slices.Contains(rep.Tools, "exec_command") || !slices.Contains(rep.Tools, "sandbox_create") {
		f.t.Fatalf("tools through %s: %v", url, rep.Tools)
	}
	if len(rep.Results) != len(calls) {
		f.t.Fatalf("%d results for %d calls", len(rep.Results), len(calls))
	}
	return rep.Results
}

// nodeOf is the index of the node sandbox id's tag names.
func (f *fleet) nodeOf(id string) int {
	f.t.Helper()
	tag, ok := sandbox.IDNodeTag(id)
	for i, name := range f.names {
		if ok && sandbox.NodeTag(name) == tag {
			return i
		}
	}
	f.t.Fatalf("sandbox %q names no node of the fleet", id)
	return -1
}

// TestGatewayMCP: the official MCP TypeScript SDK against the gateway's
// /mcp (the real `mcp-sandboxd gateway`): sandbox_create lands on a node;
// exec_command, file_write, file_read and run_code about it reach that
// node; run_code without a sandbox is placed; a node's error keeps its code
// and message; another tenant's sandbox is refused; the sandboxes of a
// node that is down are unavailable, by name, and come back with it; and
// what the gateway adds to an MCP exec_command against the node's own /mcp.
func TestGatewayMCP(t *testing.T) {
	f := newFleet(t)
	// Gateway 2 is the real binary, whose /mcp cmd/mcp-sandboxd wires.
	mcpURL := f.gateways[1] + "/mcp"
	const content = "written through the gateway"
	res := f.mcpSession(mcpURL, f.adminKey,
		mcpCall{Name: "sandbox_create", Args: map[string]any{"language": "shell"}},
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": "$sandbox", "command": "echo via-gateway; echo oops >&2; exit 4"}},
		mcpCall{Name: "file_write", Args: map[string]any{"sandbox_id": "$sandbox", "path": "/workspace/gw.txt", "content": content}},
		mcpCall{Name: "file_read", Args: map[string]any{"sandbox_id": "$sandbox", "path": "/workspace/gw.txt"}},
		mcpCall{Name: "run_code", Args: map[string]any{"sandbox_id": "$sandbox", "language": "shell", "code": "cat /workspace/gw.txt"}},
		mcpCall{Name: "run_code", Args: map[string]any{"language": "shell", "code": "echo placed"}},
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": "$sandbox", "command": "true", "timeout_seconds": -1}},
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": "sb-ffffffff000000000000", "command": "true"}},
		mcpCall{Name: "sandbox_list", Args: map[string]any{}},
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": "$sandbox", "command": "echo first; sleep 2; echo second"}, Progress: true},
	)
	for i, r := range res[:6] {
		if r.IsError {
			t.Fatalf("call %d %s(%v): %s", i, r.Name, r.Args, r.Text)
		}
	}
	id, _ := res[0].Structured["sandbox_id"].(string)
	owner := f.nodeOf(id)
	if got := f.onNode()[id]; got != f.names[owner] {
		t.Fatalf("sandbox %s carries the tag of %s, but %q holds it", id, f.names[owner], got)
	}
	t.Logf("sandbox_create through the gateway landed on %s (%s)", f.names[owner], id)
	if s := res[1].Structured; s["stdout"] != "via-gateway\n" || s["stderr"] != "oops\n" || s["exit_code"] != float64(4) {
		t.Errorf("exec_command: %v", s)
	}
	if s := res[3].Structured; s["content"] != content {
		t.Errorf("file_read: %v", s)
	}
	// The file is on the sandbox's node, as the node itself says.
	direct := "http://" + f.nodes[owner].HTTPAddr
	if got := f.exec(direct, f.nodes[owner].Token(), id, "cat /workspace/gw.txt"); got != content {
		t.Errorf("the node holds %q, want %q", got, content)
	}
	if s := res[4].Structured; s["success"] != true || s["stdout"] != content || s["sandbox_id"] != id {
		t.Errorf("run_code in the sandbox: %v", s)
	}
	placed, _ := res[5].Structured["sandbox_id"].(string)
	if s := res[5].Structured; s["success"] != true || s["stdout"] != "placed\n" || placed == id {
		t.Errorf("run_code without a sandbox: %v", s)
	}
	t.Logf("run_code without a sandbox was placed on %s", f.names[f.nodeOf(placed)])

	// The node's own error, code and message, word for word.
	code, b := f.do(direct, f.nodes[owner].Token(), http.MethodPost, "/v1/sandboxes/"+id+"/exec", `{"command":"true","timeout_seconds":-1}`)
	var nodeErr apitypes.ErrorResponse
	if err := json.Unmarshal(b, &nodeErr); err != nil || code < 400 || nodeErr.Error.Code == "" {
		t.Fatalf("the node's answer to a negative timeout: %d %s", code, b)
	}
	if want := nodeErr.Error.Code + ": " + nodeErr.Error.Message; !res[6].IsError || !strings.HasPrefix(res[6].Text, want) {
		t.Errorf("a node's error through the gateway: %v %q, want it to start %q", res[6].IsError, res[6].Text, want)
	}
	if r := res[7]; !r.IsError || !strings.HasPrefix(r.Text, `not_found: sandbox_id: "sb-ffffffff000000000000" names no node of this fleet`) {
		t.Errorf("a sandbox of no node: %v %q", r.IsError, r.Text)
	}
	// The node's exec stream reaches the MCP client as it runs: the first
	// line as a progress notification long before the command ends.
	if r := res[9]; r.IsError || r.Structured["stdout"] != "first\nsecond\n" || r.MS < 2000 {
		t.Errorf("exec_command with progress: %v %q in %.0f ms", r.IsError, r.Text, r.MS)
	} else if len(r.Progress) == 0 || !strings.Contains(r.Progress[0].Message, "first") || r.Progress[0].MS > r.MS-1000 {
		t.Errorf("progress of a streamed exec through the gateway: %+v, call took %.0f ms; want \"first\" at least 1 s before the end", r.Progress, r.MS)
	} else {
		t.Logf("progress through the gateway: %q at %.0f ms of %.0f", r.Progress[0].Message, r.Progress[0].MS, r.MS)
	}
	listed := false
	for _, sb := range res[8].Structured["sandboxes"].([]any) {
		listed = listed || sb.(map[string]any)["sandbox_id"] == id
	}
	if !listed {
		t.Errorf("sandbox_list through the gateway lacks %s: %v", id, res[8].Structured)
	}

	// Another tenant's key: the admin's sandbox does not exist for it,
	// and what it creates is its own.
	res = f.mcpSession(mcpURL, f.aliceKey,
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": id, "command": "true"}},
		mcpCall{Name: "file_read", Args: map[string]any{"sandbox_id": id, "path": "/workspace/gw.txt"}},
		mcpCall{Name: "sandbox_create", Args: map[string]any{"language": "shell"}},
		mcpCall{Name: "sandbox_list", Args: map[string]any{}},
		mcpCall{Name: "quota_usage", Args: map[string]any{}},
	)
	for _, r := range res[:2] {
		if !r.IsError || !strings.HasPrefix(r.Text, "not_found:") {
			t.Errorf("alice's %s in the admin's sandbox: %v %q, want not_found", r.Name, r.IsError, r.Text)
		}
	}
	if res[2].IsError {
		t.Fatalf("alice's sandbox_create: %s", res[2].Text)
	}
	alices, _ := res[2].Structured["sandbox_id"].(string)
	var seen []string
	for _, sb := range res[3].Structured["sandboxes"].([]any) {
		seen = append(seen, sb.(map[string]any)["sandbox_id"].(string))
	}
	if !slices.Equal(seen, []string{alices}) {
		t.Errorf("alice's sandbox_list: %v, want only %s", seen, alices)
	}
	// quota_usage is the fleet's count of alice's key (the gateways'
	// PostgreSQL), as GET /v1/keys/self/usage on the gateway answers.
	if r := res[4]; r.IsError {
		t.Errorf("alice's quota_usage through the gateway: %s", r.Text)
	} else if use, _ := r.Structured["use"].(map[string]any); use["sandboxes"] != float64(1) || r.Structured["tenant"] != "alice" {
		t.Errorf("alice's quota_usage through the gateway: %v, want her 1 sandbox", r.Structured)
	}
	code, b = f.do(f.gateways[0], f.aliceKey, http.MethodGet, "/v1/keys/self/usage", "")
	var restUse apitypes.KeyUsage
	if err := json.Unmarshal(b, &restUse); code != http.StatusOK || err != nil || restUse.Use.Sandboxes != 1 {
		t.Errorf("alice's usage over REST through the other gateway: %d %s, want 1 sandbox", code, b)
	}

	// An artifact exported on the sandbox's node is downloaded through
	// either gateway from that node, whichever node is asked first.
	code, b = f.do(f.gateways[0], f.adminKey, http.MethodPost, "/v1/sandboxes/"+id+"/export?path=/workspace", "")
	var art apitypes.Artifact
	if err := json.Unmarshal(b, &art); code != http.StatusCreated || err != nil || art.ID == "" {
		t.Fatalf("export through the gateway: %d %s", code, b)
	}
	for i := range 6 {
		code, b := f.do(f.gateways[i%2], f.adminKey, http.MethodGet, art.DownloadPath, "")
		if code != http.StatusOK || int64(len(b)) != art.Size || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("download %d of %s through gateway %d: %d, %d bytes, want the %d-byte tar.gz", i, art.ID, i%2+1, code, len(b), art.Size)
		}
	}
	if code, b := f.do(f.gateways[1], f.aliceKey, http.MethodGet, art.DownloadPath, ""); code != http.StatusNotFound {
		t.Errorf("alice downloading the admin's artifact through the gateway: %d %s, want 404", code, b)
	}

	// A stdio-only MCP client through `mcp-sandboxd stdio --url` (in the
	// fabric namespace, as the client): the same gateway, the same key.
	var rep struct {
		Results []mcpResult `json:"results"`
	}
	f.gatewayMJS(map[string]any{"stdio": map[string]any{
		"command": filepath.Join(testenv.BinDir(t), "mcp-sandboxd"),
		"args":    []string{"stdio", "--url", f.gateways[1]},
		"env":     map[string]string{"SANDBOXD_TOKEN": f.aliceKey, "PATH": "/usr/bin:/bin"},
	}, "calls": []mcpCall{
		{Name: "exec_command", Args: map[string]any{"sandbox_id": alices, "command": "echo over stdio"}},
		{Name: "exec_command", Args: map[string]any{"sandbox_id": id, "command": "true"}},
	}}, &rep)
	if len(rep.Results) != 2 || rep.Results[0].IsError || rep.Results[0].Structured["stdout"] != "over stdio\n" {
		t.Errorf("exec_command through mcp-sandboxd stdio --url: %+v", rep.Results)
	} else if r := rep.Results[1]; !r.IsError || !strings.HasPrefix(r.Text, "not_found:") {
		t.Errorf("alice's exec in the admin's sandbox over stdio: %v %q, want not_found", r.IsError, r.Text)
	}

	// The gateway's overhead on an MCP exec_command: through the
	// gateway's /mcp and the node's own, alternately, in one run.
	n := envInt("SANDBOXD_GATEWAY_MCP_BENCH", 40)
	var bench struct{ A, B []float64 }
	f.gatewayMJS(map[string]any{"bench": map[string]any{
		"a":          map[string]any{"url": mcpURL, "token": f.adminKey},
		"b":          map[string]any{"url": direct + "/mcp", "token": f.nodes[owner].Token()},
		"sandbox_id": id, "n": n,
	}}, &bench)
	if len(bench.A) != n || len(bench.B) != n {
		t.Fatalf("bench: %d and %d calls, want %d", len(bench.A), len(bench.B), n)
	}
	ms := func(v []float64) time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x * float64(time.Millisecond))
		}
		return median(d)
	}
	over := ms(bench.A) - ms(bench.B)
	t.Logf("MCP exec_command median over %d: through the gateway %v, on the node %v, overhead %v", n, ms(bench.A), ms(bench.B), over)
	// The gateway's MCP adds a REST hop and its re-encoding to the
	// node's: a few milliseconds on a shared 2-core machine, not tens.
	if over > 10*time.Millisecond {
		t.Errorf("the gateway adds %v to an MCP exec_command, want at most 10ms", over)
	}

	// The node dies: its sandboxes are unavailable, by name; the others'
	// keep working; and they come back with it.
	f.nodes[owner].Crash()
	res = f.mcpSession(mcpURL, f.adminKey,
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": id, "command": "true"}},
		mcpCall{Name: "sandbox_create", Args: map[string]any{"language": "shell"}},
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": "$sandbox", "command": "echo alive"}},
	)
	if r := res[0]; !r.IsError || !strings.HasPrefix(r.Text, "unavailable:") || !strings.Contains(r.Text, id) || !strings.Contains(r.Text, f.names[owner]) {
		t.Errorf("exec_command on the dead %s: %v %q, want unavailable naming %s and the node", f.names[owner], r.IsError, r.Text, id)
	}
	if res[1].IsError || res[2].IsError || res[2].Structured["stdout"] != "alive\n" {
		t.Errorf("create and exec while %s is down: %q %q", f.names[owner], res[1].Text, res[2].Text)
	} else if f.nodeOf(res[1].Structured["sandbox_id"].(string)) == owner {
		t.Errorf("a create went to the dead %s", f.names[owner])
	}
	// It comes back with its SSH endpoint on (ssh.listen, in its own
	// namespace: not reachable from the fabric but through the API).
	d := f.nodes[owner]
	d.Config.SSH.Listen = fmt.Sprintf("198.19.%d.2:2222", owner+1)
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	res = f.mcpSession(mcpURL, f.adminKey,
		mcpCall{Name: "exec_command", Args: map[string]any{"sandbox_id": id, "command": "cat /workspace/gw.txt"}},
	)
	if r := res[0]; r.IsError || r.Structured["stdout"] != content {
		t.Errorf("exec_command after %s came back: %v %q", f.names[owner], r.IsError, r.Text)
	}

	// SSH through the gateway: sandboxctl mints a single-use token through
	// it (routed to the sandbox's node) and runs OpenSSH whose
	// ProxyCommand carries the connection over the gateway to that node's
	// SSH endpoint (GET /v1/sandboxes/{id}/ssh/connect).
	sshThrough := func(key string, command ...string) (string, string, error) {
		argv := append([]string{"--net=/run/netns/" + f.fabricName, "--", filepath.Join(testenv.BinDir(t), "sandboxctl"),
			"--url", f.gateways[1], "ssh", "--proxy", id, "--", "-o", "BatchMode=no", "-o", "ConnectTimeout=20"}, command...)
		cmd := exec.Command("nsenter", argv...)
		cmd.Env = append(os.Environ(), "SANDBOXD_TOKEN="+key, "HOME="+t.TempDir())
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	if out, errOut, err := sshThrough(f.adminKey, "cat", "/workspace/gw.txt"); err != nil || out != content {
		t.Errorf("ssh through the gateway: %v: stdout %q, stderr %s", err, out, errOut)
		if l := d.Log(); len(l) > 6000 {
			t.Logf("node log (end): %s", l[len(l)-6000:])
		}
	}
	if out, errOut, err := sshThrough(f.aliceKey, "cat", "/workspace/gw.txt"); err == nil || out != "" || !strings.Contains(errOut, "not_found") {
		t.Errorf("alice's ssh to the admin's sandbox through the gateway: %v: stdout %q, stderr %s; want refused, not_found", err, out, errOut)
	}

	// A key registered through a gateway (sandboxctl ssh-keys add) is on
	// every node, so an OpenSSH login with it reaches a sandbox of any
	// node through the gateway; removed through the gateway, it is gone
	// from every node and logs in no more.
	dir := t.TempDir()
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gw-key", "-f", filepath.Join(dir, "id")).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	ctl := func(args ...string) (string, error) {
		argv := append([]string{"--net=/run/netns/" + f.fabricName, "--", filepath.Join(testenv.BinDir(t), "sandboxctl"), "--url", f.gateways[0]}, args...)
		cmd := exec.Command("nsenter", argv...)
		cmd.Env = append(os.Environ(), "SANDBOXD_TOKEN="+f.adminKey)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := ctl("ssh-keys", "add", filepath.Join(dir, "id.pub"))
	fields := strings.Fields(out)
	if err != nil || len(fields) < 3 || !strings.HasPrefix(fields[1], "SHA256:") {
		t.Fatalf("sandboxctl --url GATEWAY ssh-keys add: %v %s", err, out)
	}
	keyID, fp := fields[0], fields[1]
	onNodes := func() []int {
		var n []int
		for i, d := range f.nodes {
			code, b := f.do("http://"+d.HTTPAddr, d.Token(), http.MethodGet, "/v1/ssh/keys", "")
			var l apitypes.SSHKeyList
			if code != http.StatusOK || json.Unmarshal(b, &l) != nil {
				t.Fatalf("%s's ssh keys: %d %s", f.names[i], code, b)
			}
			for _, k := range l.Keys {
				if k.Fingerprint == fp {
					n = append(n, i)
				}
			}
		}
		return n
	}
	if got := onNodes(); len(got) != len(f.nodes) {
		t.Errorf("the key added through the gateway is on nodes %v, want all %d", got, len(f.nodes))
	}
	if out, err := ctl("ssh-keys", "list"); err != nil || strings.Count(out, fp) != 1 {
		t.Errorf("sandboxctl --url GATEWAY ssh-keys list: %v %s, want %s once", err, out, fp)
	}
	// The host key checked strictly: the sandbox's node's, as it says.
	code, b = f.do(direct, f.nodes[owner].Token(), http.MethodGet, "/v1/ssh", "")
	var ep apitypes.SSHEndpoint
	if code != http.StatusOK || json.Unmarshal(b, &ep) != nil || ep.HostKey == "" {
		t.Fatalf("%s's ssh endpoint: %d %s", f.names[owner], code, b)
	}
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte("mcp-sandboxd "+ep.HostKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyLogin := func() (string, string, error) {
		cmd := exec.Command("nsenter", "--net=/run/netns/"+f.fabricName, "--", "ssh",
			"-i", filepath.Join(dir, "id"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "PreferredAuthentications=publickey",
			"-o", "UserKnownHostsFile="+kh, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlias=mcp-sandboxd", "-o", "StrictHostKeyChecking=yes",
			"-o", "ConnectTimeout=20", "-o", "ProxyCommand="+filepath.Join(testenv.BinDir(t), "sandboxctl")+" --url "+f.gateways[1]+" ssh-proxy --sandbox "+id,
			"-l", id, "mcp-sandboxd", "cat", "/workspace/gw.txt")
		cmd.Env = append(os.Environ(), "SANDBOXD_TOKEN="+f.adminKey, "HOME="+dir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	if out, errOut, err := keyLogin(); err != nil || out != content {
		t.Errorf("OpenSSH login with the key added through the gateway: %v: stdout %q, stderr %s", err, out, errOut)
	}
	if out, err := ctl("ssh-keys", "rm", keyID); err != nil {
		t.Errorf("sandboxctl --url GATEWAY ssh-keys rm %s: %v %s", keyID, err, out)
	}
	if got := onNodes(); len(got) != 0 {
		t.Errorf("the key removed through the gateway is still on nodes %v", got)
	}
	if out, errOut, err := keyLogin(); err == nil || out != "" || !strings.Contains(errOut, "Permission denied") {
		t.Errorf("OpenSSH login with the removed key: %v: stdout %q, stderr %s; want refused", err, out, errOut)
	}
}
