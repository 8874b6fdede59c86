package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestVMDaemon drives VMs through a real daemon: `sandboxctl images build
// --vm`, `sandboxctl create --backend vm` and the sandbox commands (REST
// /v1/sandboxes), the sandbox MCP tools over HTTP (sandbox_screenshot
// answers an image), /readyz's vm line; then SIGKILL of the daemon with
// the VM running, a restart that adopts it, and exec on the adopted VM
// reading a file written before the crash. One VM, started from
// the fast-start snapshot (pkg/engine's TestVMs or pkg/sandbox/qemu's
// tests boot the template once into the shared cache).
func TestVMDaemon(t *testing.T) {
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("boots VMs")
	}
	d := testenv.NewDaemon(t)
	d.Start()

	out := d.MustCtl("images", "build", "--vm", "python")
	if !strings.HasPrefix(out, "vm-python\t") {
		t.Fatalf("images build --vm python: %q", out)
	}
	t0 := time.Now()
	id := strings.TrimSpace(d.MustCtl("create", "--backend", "vm", "--image", "python"))
	t.Logf("vm %s created in %v", id, time.Since(t0))
	if got := d.MustCtl("exec", id, "--", "uname", "-r"); !strings.HasSuffix(got, "-cloud-amd64\n") {
		t.Errorf("exec uname -r in the VM: %q", got)
	}
	if _, _, code := d.Ctl("exec", id, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("exec exit code in the VM: %d", code)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(src, []byte("before the crash\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.MustCtl("cp", src, id+":/workspace/in.txt")
	if got := d.MustCtl("cp", id+":/workspace/in.txt", "-"); got != "before the crash\n" {
		t.Errorf("cp out of the VM: %q", got)
	}
	var ps []struct {
		ID      string `json:"sandbox_id"`
		Image   string `json:"image"`
		Backend string `json:"backend"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("--json", "ps")), &ps); err != nil || len(ps) != 1 || ps[0].ID != id || ps[0].Image != "vm-python" || ps[0].Backend != "vm" {
		t.Errorf("ps: %+v %v", ps, err)
	}
	shot := filepath.Join(dir, "screen.png")
	d.MustCtl("screenshot", id, shot)
	if f, err := os.Open(shot); err != nil {
		t.Error(err)
	} else if _, err := png.Decode(f); err != nil {
		t.Errorf("screenshot: %v", err)
	}
	if _, errOut, code := d.Ctl("snapshot", id, "--name", "a/b"); code == 0 || !strings.Contains(errOut, "name:") {
		t.Errorf("snapshot --name a/b: exit %d %q", code, errOut)
	}
	s1 := strings.TrimSpace(d.MustCtl("snapshot", id, "--name", "s1"))
	d.MustCtl("exec", id, "--", "touch", "/workspace/later")
	d.MustCtl("restore", id, s1)
	if _, _, code := d.Ctl("exec", id, "--", "test", "-e", "/workspace/later"); code != 1 {
		t.Errorf("a file written after the snapshot exists after restore (test -e: exit %d)", code)
	}
	// "ready" is the fast-start snapshot the VM started from (as booted).
	var insp struct {
		Backend string `json:"backend"`
		VM      struct {
			Snapshots []string `json:"snapshots"`
		} `json:"vm"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", id)), &insp); err != nil || insp.Backend != "vm" || !slices.Equal(insp.VM.Snapshots, []string{"ready", "s1"}) {
		t.Errorf("inspect: %+v %v", insp, err)
	}
	if res, err := d.UnixGet("/v1/sandboxes/" + id); err != nil || res.StatusCode != 200 {
		t.Errorf("GET the VM: %v %v", res, err)
	} else if b, _ := io.ReadAll(res.Body); !strings.Contains(string(b), `"snapshots":["ready","s1"]`) {
		t.Errorf("GET the VM's snapshots: %s", b)
	}
	if res, err := d.UnixGet("/v1/sandboxes/sb-000000000000"); err != nil || res.StatusCode != 404 {
		t.Errorf("GET an unknown VM: %v %v", res, err)
	}
	// The /v1/vms routes are gone (no aliases).
	if res, err := d.UnixGet("/v1/vms"); err != nil || res.StatusCode != 404 {
		t.Errorf("GET /v1/vms: %v %v", res, err)
	}
	// vm test through REST: a second VM (vm.max_vms is 2), a failing step.
	if err := os.WriteFile(filepath.Join(dir, "calc.py"), []byte("x = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tcmd := exec.Command(filepath.Join(d.Bin, "sandboxctl"), "--socket", d.Socket, "vm-test", "--image", "python",
		"--file", "calc.py", "--test", "python3 -c 'import calc; print(calc.x)'", "--test", "echo broken >&2; exit 4")
	tcmd.Dir = dir
	tout, err := tcmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(tout), "exit 4") || !strings.Contains(string(tout), "broken") || !strings.Contains(string(tout), "passed: false") {
		t.Errorf("vm-test with a failing step: %v\n%s", err, tout)
	}
	// run_code in a VM through sandboxctl run --backend vm.
	mainPy := filepath.Join(dir, "main.py")
	if err := os.WriteFile(mainPy, []byte("import os\nprint('run in', os.uname().release.split('-')[-1])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := d.MustCtl("run", "--lang", "python", "--backend", "vm", mainPy); got != "run in amd64\n" {
		t.Errorf("sandboxctl run --backend vm: %q", got)
	}

	// /readyz reports the VM backend and the accelerator probed at the
	// first start.
	res, err := d.UnixGet("/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var ready struct {
		Checks []struct{ Name, Status, Reason string } `json:"checks"`
	}
	_ = json.NewDecoder(res.Body).Decode(&ready)
	found := false
	for _, c := range ready.Checks {
		if c.Name == "vm" {
			found = true
			if c.Status != "ok" || !strings.Contains(c.Reason, "kvm: false") || !strings.Contains(c.Reason, "accel: tcg") {
				t.Errorf("readyz vm: %+v", c)
			}
		}
	}
	if !found {
		t.Errorf("readyz has no vm check: %+v", ready)
	}

	// MCP: the sandbox tools on the VM, sandbox_screenshot's image; the
	// vm_* tools they replace are gone.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mc := mcpSession(ctx, t, d)
	defer mc.Close()
	tools, err := mc.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, tl := range tools.Tools {
		have[tl.Name] = true
	}
	for _, n := range []string{"sandbox_create", "exec_command", "file_write", "file_read", "sandbox_snapshot", "sandbox_restore", "sandbox_screenshot", "vm_test"} {
		if !have[n] {
			t.Errorf("tool %s missing", n)
		}
	}
	for _, n := range []string{"vm_create", "vm_list", "vm_get", "vm_destroy", "vm_exec", "vm_file_write", "vm_file_read", "vm_snapshot", "vm_restore", "vm_screenshot"} {
		if have[n] {
			t.Errorf("removed tool %s still offered", n)
		}
	}
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		r, err := mc.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return r
	}
	if r := call("exec_command", map[string]any{"sandbox_id": id, "command": "cat /workspace/in.txt"}); r.IsError || !strings.Contains(toJSON(r.StructuredContent), "before the crash") {
		t.Errorf("exec_command on the VM over MCP: %+v", r)
	}
	r := call("sandbox_screenshot", map[string]any{"sandbox_id": id})
	var img *mcp.ImageContent
	for _, c := range r.Content {
		if ic, ok := c.(mcp.ImageContent); ok {
			img = &ic
		}
	}
	if r.IsError || img == nil || img.MIMEType != "image/png" {
		t.Fatalf("sandbox_screenshot over MCP: %+v", r)
	}
	if b, err := base64.StdEncoding.DecodeString(img.Data); err != nil {
		t.Error(err)
	} else if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Errorf("sandbox_screenshot image: %v", err)
	}
	// vm_test over MCP: a failing step answers the steps and the screen
	// as an image.
	r = call("vm_test", map[string]any{"image": "python", "files": map[string]any{"a.txt": "x"},
		"test": []string{"test -s a.txt", "echo boom; exit 2"}})
	var tres struct {
		Passed        bool `json:"passed"`
		FailedStep    int  `json:"failed_step"`
		HasScreenshot bool `json:"has_screenshot"`
		Destroyed     bool `json:"destroyed"`
		Steps         []struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
		} `json:"steps"`
	}
	_ = json.Unmarshal([]byte(toJSON(r.StructuredContent)), &tres)
	img = nil
	for _, c := range r.Content {
		if ic, ok := c.(mcp.ImageContent); ok {
			img = &ic
		}
	}
	if r.IsError || tres.Passed || tres.FailedStep != 1 || !tres.HasScreenshot || !tres.Destroyed || len(tres.Steps) != 2 ||
		tres.Steps[1].ExitCode != 2 || tres.Steps[1].Stdout != "boom\n" || img == nil || img.MIMEType != "image/png" {
		t.Errorf("vm_test over MCP: %+v %+v", tres, r)
	}
	if r := call("sandbox_create", map[string]any{"backend": "vm", "os": "windows"}); !r.IsError || !strings.Contains(toJSON(r.Content), "vm.images.windows") {
		t.Errorf("sandbox_create {backend: vm, os: windows} over MCP: %+v", r)
	}
	mc.Close()

	// kill -9 with the VM running; the restarted daemon adopts it.
	d.Crash()
	d.Start()
	if got := d.MustCtl("exec", id, "--", "cat", "/workspace/in.txt"); got != "before the crash\n" {
		t.Errorf("exec on the VM after the daemon's restart: %q", got)
	}
	if !strings.Contains(d.Log(), "adopted=1") {
		t.Errorf("the VM was not adopted:\n%s", d.Log())
	}
	d.MustCtl("rm", id)
	if _, errOut, code := d.Ctl("exec", id, "--", "true"); code == 0 || !strings.Contains(errOut, "sandbox "+id+" is terminated") {
		t.Errorf("exec after rm: exit %d %q", code, errOut)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.Config.Paths.RunDir, "vms")); len(ents) != 0 {
		t.Errorf("VM dirs left: %v", ents)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
