// Package e2e drives the real binaries — mcp-sandboxd serve, sandboxctl — the
// way an administrator does, and checks what the kernel was left with.
package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
)

var idRe = regexp.MustCompile(`^sb-[0-9a-f]{12}$`)

func createSandbox(d *testenv.Daemon, args ...string) string {
	d.T.Helper()
	id := strings.TrimSpace(d.MustCtl(append([]string{"create", "--lang", "shell"}, args...)...))
	if !idRe.MatchString(id) {
		d.T.Fatalf("create printed %q, want a sandbox id", id)
	}
	return id
}

func TestCLIRoundTrip(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)

	out, errOut, code := d.Ctl("exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if out != "out\n" || errOut != "err\n" || code != 7 {
		t.Fatalf("exec: stdout %q stderr %q exit %d; want out/err/7", out, errOut, code)
	}
	// --json gives the result object with the output and the termination.
	out, _, code = d.Ctl("exec", "--json", id, "--", "sh", "-c", "echo hi; exit 3")
	var res struct {
		ExitCode    int    `json:"exit_code"`
		Stdout      string `json:"stdout"`
		Termination struct {
			Cause string `json:"cause"`
		} `json:"termination"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 3 || res.ExitCode != 3 || res.Stdout != "hi\n" || res.Termination.Cause != "exited" {
		t.Errorf("exec --json: %q (exit %d, err %v)", out, code, err)
	}

	// cp round-trips 5 MiB of random bytes, both directions, byte for byte.
	src := filepath.Join(t.TempDir(), "blob")
	blob := make([]byte, 5<<20)
	_, _ = rand.Read(blob)
	if err := os.WriteFile(src, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	d.MustCtl("cp", src, id+":/workspace/blob")
	if out := d.MustCtl("exec", id, "--", "sh", "-c", "stat -c %s /workspace/blob"); strings.TrimSpace(out) != strconv.Itoa(len(blob)) {
		t.Errorf("size inside = %q", out)
	}
	back := filepath.Join(t.TempDir(), "back")
	d.MustCtl("cp", id+":/workspace/blob", back)
	got, err := os.ReadFile(back)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("cp round trip differs (err %v, %d bytes)", err, len(got))
	}

	// export packs /workspace into a tar.gz the daemon keeps; sandboxctl
	// checks its sha256 on download.
	archive := filepath.Join(t.TempDir(), "ws.tar.gz")
	d.MustCtl("export", id, "-o", archive)
	if out, err := exec.Command("tar", "-tzf", archive).CombinedOutput(); err != nil || !strings.Contains(string(out), "./blob") {
		t.Errorf("exported archive: %v\n%s", err, out)
	}

	// inspect and ps see it; rm leaves nothing behind.
	if out := d.MustCtl("inspect", id); !strings.Contains(out, id) {
		t.Errorf("inspect: %q", out)
	}
	if out := d.MustCtl("ps"); !strings.Contains(out, id) {
		t.Errorf("ps does not list %s: %q", id, out)
	}
	d.MustCtl("rm", id)
	testenv.AssertNoLeftovers(t, d.Config)
	if _, _, code := d.Ctl("exec", id, "--", "true"); code == 0 {
		t.Error("exec on a removed sandbox succeeded")
	}
	if _, _, code := d.Ctl("inspect", "sb-000000000000"); code != 3 {
		t.Errorf("inspect unknown: exit %d, want 3", code)
	}
}

func TestInteractivePTY(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (scripts/install-deps.sh installs it)")
	}
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	session := "sbx-" + testenv.RandHex(3)
	ctl := filepath.Join(d.Bin, "sandboxctl")
	cmd := fmt.Sprintf("%s --socket %s exec -it %s -- sh; echo EXIT=$?; sleep 30", ctl, d.Socket, id)
	if out, err := exec.Command("tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
	send := func(keys string) {
		if out, err := exec.Command("tmux", "send-keys", "-t", session, keys, "Enter").CombinedOutput(); err != nil {
			t.Fatalf("send-keys: %v %s", err, out)
		}
	}
	waitFor := func(re *regexp.Regexp) string {
		t.Helper()
		var screen string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out, _ := exec.Command("tmux", "capture-pane", "-p", "-t", session).Output()
			if screen = string(out); re.MatchString(screen) {
				return screen
			}
		}
		t.Fatalf("screen never matched %s:\n%s", re, screen)
		return ""
	}
	send("tty")
	waitFor(regexp.MustCompile(`/dev/pts/\d+`))
	send("stty size")
	waitFor(regexp.MustCompile(`(?m)^24 80\s*$`))
	if out, err := exec.Command("tmux", "resize-window", "-t", session, "-x", "100", "-y", "50").CombinedOutput(); err != nil {
		t.Fatalf("resize-window: %v %s", err, out)
	}
	time.Sleep(300 * time.Millisecond) // SIGWINCH → resize message → TIOCSWINSZ
	send("stty size")
	waitFor(regexp.MustCompile(`(?m)^50 100\s*$`))
	send("exit 4")
	waitFor(regexp.MustCompile(`EXIT=4`))
}

func TestCrashAndRestart(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	idle := createSandbox(d)
	busy := createSandbox(d)
	doomed := createSandbox(d)

	// A command in flight when the daemon dies: its output and exit code must
	// still be readable afterwards.
	inflight := exec.Command(filepath.Join(d.Bin, "sandboxctl"), "--socket", d.Socket, "exec", busy, "--", "sh", "-c", "sleep 3; echo done")
	if err := inflight.Start(); err != nil {
		t.Fatal(err)
	}
	defer inflight.Wait() //nolint:errcheck // it fails when the daemon dies; that is the point
	waitState(t, d, busy, "running")
	// "running" is recorded before the agent starts the command: wait until
	// the agent has it, so the crash comes while it runs.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if out, _, code := d.Ctl("jobs", "--json", busy); code == 0 && (strings.Contains(out, `"state": "running"`) || strings.Contains(out, `"state":"running"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the in-flight command never showed up in sandboxctl jobs %s", busy)
		}
	}

	d.Crash()
	// While the daemon is down, doomed's init dies.
	agentPid := initPid(t, d, doomed)
	if err := syscall.Kill(agentPid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill init of %s: %v", doomed, err)
	}
	time.Sleep(200 * time.Millisecond)

	d.Start()
	if s := sandboxState(t, d, idle); s != "ready" {
		t.Errorf("idle sandbox after restart: %s, want ready", s)
	}
	if s := sandboxState(t, d, busy); s != "running" && s != "ready" {
		t.Errorf("busy sandbox after restart: %s", s)
	}
	if s := sandboxState(t, d, doomed); s != "terminated" {
		t.Errorf("sandbox whose init died: %s, want terminated", s)
	}
	// The in-flight command finishes; its output and exit code are readable.
	waitState(t, d, busy, "ready")
	out := d.MustCtl("jobs", "--json", busy)
	var jobs []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Exit  *struct {
			ExitCode int    `json:"exit_code"`
			Cause    string `json:"cause"`
		} `json:"exit"`
	}
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || len(jobs) != 1 || jobs[0].Exit == nil {
		t.Fatalf("jobs after restart: %q (%v)", out, err)
	}
	if jobs[0].Exit.ExitCode != 0 || jobs[0].Exit.Cause != "exited" {
		t.Errorf("job outcome after restart: %+v", jobs[0].Exit)
	}
	logs := d.MustCtl("logs", busy, jobs[0].ID)
	if logs != "done\n" {
		t.Errorf("job output after restart: %q, want done", logs)
	}
	// Everything still works, and nothing was lost or duplicated: exactly two
	// live sandboxes, each with its cgroup and its two mounts.
	if out := d.MustCtl("exec", idle, "--", "echo", "still here"); out != "still here\n" {
		t.Errorf("exec in the adopted sandbox: %q", out)
	}
	children, err := cgroups.Children(d.Config.Sandbox.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	var cgs []string
	for _, c := range children {
		if strings.HasPrefix(c, "sb-") {
			cgs = append(cgs, c)
		}
	}
	want := []string{idle, busy}
	slices.Sort(cgs)
	slices.Sort(want)
	if !slices.Equal(cgs, want) {
		t.Errorf("sandbox cgroups after restart: %v, want those of %s and %s", cgs, idle, busy)
	}
	if m := testenv.MountsUnder(filepath.Join(d.Config.Paths.RunDir, "sandboxes", doomed)); len(m) != 0 {
		t.Errorf("mounts of the dead sandbox left: %v", m)
	}
	for _, id := range []string{idle, busy} {
		// The overlay and the disk; the user namespace's pin went once the
		// sandbox ran (its processes hold the namespace: one mount fewer on
		// the host per live sandbox).
		dir := filepath.Join(d.Config.Paths.RunDir, "sandboxes", id)
		m := testenv.MountsUnder(dir)
		slices.Sort(m)
		if want := []string{filepath.Join(dir, "disk"), filepath.Join(dir, "layers", "rootfs")}; !slices.Equal(m, want) {
			t.Errorf("mounts of %s after restart: %v, want overlay and disk %v", id, m, want)
		}
		if _, err := os.Lstat(filepath.Join(dir, "userns")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("user namespace pin of running sandbox %s: %v, want none", id, err)
		}
	}
}

func sandboxState(t *testing.T, d *testenv.Daemon, id string) string {
	t.Helper()
	out := d.MustCtl("inspect", "--json", id)
	var s struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("inspect --json: %q: %v", out, err)
	}
	return s.State
}

func waitState(t *testing.T, d *testenv.Daemon, id, want string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if sandboxState(t, d, id) == want {
			return
		}
	}
	t.Fatalf("%s never reached %s (now %s)", id, want, sandboxState(t, d, id))
}

// initPid finds the sandbox's init (the agent) from its cgroup.
func initPid(t *testing.T, d *testenv.Daemon, id string) int {
	t.Helper()
	procs, err := cgroups.Procs(path.Join(d.Config.Sandbox.CgroupParent, id))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range procs {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmd), "/.sandboxd/agent") {
			return pid
		}
	}
	t.Fatalf("no agent in %s's cgroup: %v", id, procs)
	return 0
}

func TestReadinessAndMetrics(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	d.MustCtl("rm", id)
	createSandbox(d)

	res, err := d.UnixGet("/readyz")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("readyz: %v %v", res, err)
	}
	if _, _, code := d.Ctl("health"); code != 0 {
		t.Errorf("health while ready: exit %d", code)
	}
	metrics, _ := d.UnixGet("/metrics")
	body, _ := io.ReadAll(metrics.Body)
	if !regexp.MustCompile(`sandboxd_sandboxes_created_total\{outcome="ready"\} 2\b`).Match(body) {
		t.Errorf("metrics do not count the 2 created sandboxes:\n%s", grepLines(body, "sandboxd_"))
	}
	if !regexp.MustCompile(`sandboxd_sandboxes\{state="terminated"\} 1\b`).Match(body) {
		t.Errorf("metrics do not show 1 terminated sandbox:\n%s", grepLines(body, "sandboxd_sandboxes"))
	}

	// Make the cgroup parent unusable: terminate what lives in it and remove it.
	for _, id := range d.LiveIDs() {
		d.MustCtl("rm", id)
	}
	dirs := cgroups.Dirs(d.Config.Sandbox.CgroupParent)
	if len(dirs) == 0 {
		t.Fatalf("cgroup parent %s does not exist", d.Config.Sandbox.CgroupParent)
	}
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil {
			t.Fatalf("remove %s: %v", dir, err)
		}
	}
	res, _ = d.UnixGet("/readyz")
	rb, _ := io.ReadAll(res.Body)
	if res.StatusCode != 503 || !strings.Contains(string(rb), `"cgroups"`) {
		t.Errorf("readyz with the cgroup parent gone: %d %s", res.StatusCode, rb)
	}
	if _, _, code := d.Ctl("health"); code != 5 {
		t.Errorf("health while not ready: exit %d, want 5", code)
	}
}

func grepLines(b []byte, sub string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHTTPAuthAndErrors(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	base := "http://" + d.HTTPAddr
	do := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := do("GET", "/healthz", "", ""); code != 200 {
		t.Errorf("healthz without token: %d", code)
	}
	if code, body := do("POST", "/v1/sandboxes", "", `{"language":"shell"}`); code != 401 {
		t.Errorf("create without token: %d %s", code, body)
	}
	if code, _ := do("POST", "/v1/sandboxes", "wrong-token-wrong-token", `{"language":"shell"}`); code != 401 {
		t.Errorf("create with a wrong token: %d", code)
	}
	if out := d.MustCtl("ps", "--all", "--json"); strings.Contains(out, "sb-") {
		t.Errorf("an unauthenticated request created a sandbox: %s", out)
	}
	tok := d.Token()
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", `{"language":`, 400, "invalid_argument"},
		{"unknown field", "POST", "/v1/sandboxes", `{"language":"shell","colour":"blue"}`, 400, "invalid_argument"},
		{"oversized body", "POST", "/v1/sandboxes", `{"language":"shell","labels":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`, 400, "invalid_argument"},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-000000000000", "", 404, "not_found"},
		{"unknown language", "POST", "/v1/sandboxes", `{"language":"cobol"}`, 400, "invalid_argument"},
	} {
		status, body := do(c.method, c.path, tok, c.body)
		if status != c.status || !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %.200s; want %d with code %s", c.name, status, body, c.status, c.code)
		}
	}
	status, body := do("POST", "/v1/sandboxes", tok, `{"language":"shell"}`)
	if status != 201 || !strings.Contains(body, `"state":"ready"`) {
		t.Errorf("create with token: %d %s", status, body)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	out, err := exec.Command(filepath.Join(d.Bin, "mcp-sandboxd"), "serve", "--config", d.CfgPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another mcp-sandboxd") {
		t.Errorf("second daemon on the same state dir: err %v, output %s", err, out)
	}
}

func TestSystemdNotify(t *testing.T) {
	d := testenv.NewDaemon(t)
	sockPath := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A 400 ms watchdog: the daemon must ping every 200 ms.
	d.ExtraEnv = []string{"NOTIFY_SOCKET=" + sockPath, "WATCHDOG_USEC=400000"}

	ready := make(chan bool, 1)
	stopping := make(chan struct{}, 1)
	watchdog := make(chan struct{}, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			if strings.Contains(msg, "READY=1") {
				// At the moment READY=1 arrives, the API must already accept connections.
				c, err := net.Dial("unix", d.Socket)
				if err == nil {
					c.Close()
				}
				ready <- err == nil
			}
			if strings.Contains(msg, "STOPPING=1") {
				stopping <- struct{}{}
			}
			if strings.Contains(msg, "WATCHDOG=1") {
				select {
				case watchdog <- struct{}{}:
				default:
				}
			}
		}
	}()
	d.Start()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("READY=1 arrived before the API socket accepted connections")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no READY=1 on NOTIFY_SOCKET")
	}
	time.Sleep(time.Second)
	if n := len(watchdog); n < 3 {
		t.Errorf("%d WATCHDOG=1 pings in a second with WATCHDOG_USEC=400000, want about 5", n)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("SIGTERM: daemon exited with %v, want 0", err)
	}
	select {
	case <-stopping:
	case <-time.After(5 * time.Second):
		t.Error("no STOPPING=1 on SIGTERM")
	}
}

func TestSystemdUnitVerifies(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze is required")
	}
	b := testenv.BinDir(t)
	unit, err := os.ReadFile(filepath.Join(testenv.RepoRoot, "config", "mcp-sandboxd.service"))
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart's binary exists: point it at the built one.
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/mcp-sandboxd", filepath.Join(b, "mcp-sandboxd"))
	path := filepath.Join(t.TempDir(), "mcp-sandboxd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	var problems []string
	for _, l := range strings.Split(string(out), "\n") {
		// verify also lints units this one refers to (network-online.target …)
		// on a host that may not boot with systemd; only our file counts.
		if strings.Contains(l, "mcp-sandboxd.service") {
			problems = append(problems, l)
		}
	}
	if err != nil || len(problems) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSeccompRequired runs a daemon built without seccomp support: it must
// refuse to start sandboxes and say why in readiness, until the config turns
// seccomp off explicitly.
func TestSeccompRequired(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.DaemonBin = filepath.Join(t.TempDir(), "mcp-sandboxd-noseccomp")
	build := exec.Command("go", "build", "-o", d.DaemonBin, "./cmd/mcp-sandboxd") // no -tags seccomp
	build.Dir = testenv.RepoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build without seccomp: %v\n%s", err, out)
	}
	d.Start()
	_, errOut, code := d.Ctl("create", "--lang", "shell")
	if code == 0 || !strings.Contains(errOut, "seccomp") {
		t.Errorf("create without seccomp support: exit %d, %q; want a refusal naming seccomp", code, errOut)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes exist after the refusal: %v", ids)
	}
	res, _ := d.UnixGet("/readyz")
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 503 || !regexp.MustCompile(`"name":"seccomp","status":"failed"`).Match(body) {
		t.Errorf("readyz without seccomp: %d %s", res.StatusCode, body)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}

	// Turned off explicitly, sandboxes start, without a filter, and
	// readiness reports the degradation.
	d.ExtraEnv = []string{"SANDBOXD_SANDBOX_SECCOMP_PROFILE=unconfined"}
	d.Start()
	id := createSandbox(d)
	if out := d.MustCtl("exec", id, "--", "sh", "-c", "grep '^Seccomp:' /proc/self/status | cut -f2"); out != "0\n" {
		t.Errorf("Seccomp field with seccomp off: %q, want 0", out)
	}
	res, _ = d.UnixGet("/readyz")
	body, _ = io.ReadAll(res.Body)
	if !regexp.MustCompile(`"name":"seccomp","status":"degraded"`).Match(body) {
		t.Errorf("readyz with seccomp off: %s", body)
	}
}

// TestRunCLI drives run_code through sandboxctl: a one-shot run, its record,
// and the image commands.
func TestRunCLI(t *testing.T) {
	d := testenv.NewDaemon(t, "python")
	d.Start()
	dir := t.TempDir()
	main := filepath.Join(dir, "main.py")
	lib := filepath.Join(dir, "greet.py")
	if err := os.WriteFile(main, []byte("import sys, greet\nprint(greet.hello(sys.argv[1]))\nsys.exit(3)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("def hello(n):\n    return 'hello ' + n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.Ctl("run", "--lang", "python", "--arg", "world", main, lib)
	if out != "hello world\n" || code != 3 {
		t.Fatalf("run: stdout %q, exit %d, stderr %q", out, code, errOut)
	}
	runID := regexp.MustCompile(`--- run (\S+)`).FindStringSubmatch(errOut)
	if runID == nil {
		t.Fatalf("run printed no run id: %q", errOut)
	}
	if ls := d.MustCtl("runs", "ls"); !strings.Contains(ls, runID[1]) {
		t.Errorf("runs ls misses %s:\n%s", runID[1], ls)
	}
	show := d.MustCtl("runs", "show", runID[1])
	if !strings.Contains(show, "hello world") || !strings.Contains(show, "exit 3") {
		t.Errorf("runs show:\n%s", show)
	}
	if _, errOut, code := d.Ctl("run", "--lang", "cobol", main); code != 2 || !strings.Contains(errOut, "language") {
		t.Errorf("run with an unknown language: exit %d %q", code, errOut)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("ephemeral runs left sandboxes: %v", ids)
	}

	// images: ls shows the built ones, build of an up-to-date recipe is a
	// no-op, rm of an image in use is refused.
	if ls := d.MustCtl("images", "ls"); !strings.Contains(ls, "python") || !strings.Contains(ls, "shell") {
		t.Errorf("images ls:\n%s", ls)
	}
	d.MustCtl("images", "build", "shell")
	id := createSandbox(d)
	if _, errOut, code := d.Ctl("images", "rm", "shell"); code != 1 || !strings.Contains(errOut, id) {
		t.Errorf("images rm of an image in use: exit %d %q", code, errOut)
	}
	if out := d.MustCtl("languages"); !regexp.MustCompile(`(?m)^python\s+\S+\s+true`).MatchString(out) {
		t.Errorf("languages:\n%s", out)
	}
}

// TestSigtermDrains: SIGTERM lets a request in flight finish before the
// daemon exits 0, and the sandbox outlives the daemon.
func TestSigtermDrains(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	ctl := exec.Command(filepath.Join(d.Bin, "sandboxctl"), "--socket", d.Socket, "exec", id, "--", "sh", "-c", "sleep 2; echo done")
	var out bytes.Buffer
	ctl.Stdout = &out
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	waitState(t, d, id, "running")
	if err := d.Stop(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v", err)
	}
	if err := ctl.Wait(); err != nil || out.String() != "done\n" {
		t.Errorf("the request in flight: %v, stdout %q", err, out.String())
	}
	d.Start()
	if s := sandboxState(t, d, id); s != "ready" {
		t.Errorf("sandbox after the daemon's restart: %s, want ready", s)
	}
}

// TestBackgroundJobs: exec -d starts a job, jobs lists it, logs follows it,
// kill ends another one.
func TestBackgroundJobs(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	job := strings.TrimSpace(d.MustCtl("exec", "-d", id, "--", "sh", "-c", "echo started; sleep 1; echo finished; exit 4"))
	if !strings.HasPrefix(job, "j-") {
		t.Fatalf("exec -d printed %q, want a job id", job)
	}
	if out := d.MustCtl("jobs", id); !strings.Contains(out, job) {
		t.Errorf("jobs does not list %s:\n%s", job, out)
	}
	out, _, code := d.Ctl("logs", "-f", id, job)
	if out != "started\nfinished\n" || code != 4 {
		t.Errorf("logs -f: %q, exit %d; want both lines and exit 4", out, code)
	}

	sleeper := strings.TrimSpace(d.MustCtl("exec", "-d", id, "--", "sleep", "600"))
	d.MustCtl("kill", "-s", "SIGTERM", id, sleeper)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out := d.MustCtl("jobs", "--json", id)
		var jobs []struct {
			ID   string `json:"id"`
			Exit *struct {
				Cause  string `json:"cause"`
				Signal string `json:"signal"`
			} `json:"exit"`
		}
		if err := json.Unmarshal([]byte(out), &jobs); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.ID == sleeper && j.Exit != nil {
				if j.Exit.Cause != "signal" || j.Exit.Signal != "SIGTERM" {
					t.Errorf("killed job ended with %+v, want signal SIGTERM", *j.Exit)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("killed job still running:\n%s", out)
		}
	}
}
