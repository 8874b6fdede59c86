// Package e2e drives the real binaries — mcp-sandboxd serve, sandboxctl — the
// way an administrator does, and checks what the kernel was left with.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	repoRoot = func() string {
		_, file, _, _ := goruntime.Caller(0)
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}()
	binOnce sync.Once
	binDir  string
	binErr  error
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("SANDBOXD_INTEGRATION") == "1" {
		t.Fatal("end-to-end test needs root (SANDBOXD_INTEGRATION=1 forbids skipping)")
	}
	t.Skip("end-to-end test needs root")
}

// bins returns the directory holding mcp-sandboxd, sandboxctl and
// sandbox-agent: $SANDBOXD_BIN_DIR (make test builds them) or a fresh build.
func bins(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if d := os.Getenv("SANDBOXD_BIN_DIR"); d != "" {
			binDir = d
			return
		}
		binDir, binErr = os.MkdirTemp("", "sbx-e2e-bin-")
		if binErr != nil {
			return
		}
		for _, b := range []struct{ name, cgo, tags string }{
			{"mcp-sandboxd", "1", "seccomp"}, {"sandboxctl", "0", ""}, {"sandbox-agent", "0", ""},
		} {
			args := []string{"build", "-o", filepath.Join(binDir, b.name)}
			if b.tags != "" {
				args = append(args, "-tags", b.tags)
			}
			cmd := exec.Command("go", append(args, "./cmd/"+b.name)...)
			cmd.Dir = repoRoot
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("build %s: %v\n%s", b.name, err, out)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

func testImagesDir() string {
	if d := os.Getenv("SANDBOXD_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-images"
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// daemon is one mcp-sandboxd serve process on private state.
type daemon struct {
	t          *testing.T
	bin        string
	cfgPath    string
	stateDir   string
	runDir     string
	socket     string
	httpAddr   string
	tokenFile  string
	cgroup     string
	logPath    string
	cmd        *exec.Cmd
	exited     chan struct{}
	extraEnv   []string
	daemonBin  string // overrides bin/mcp-sandboxd
	exitErr    error
	notifyPath string
}

func newDaemon(t *testing.T) *daemon {
	t.Helper()
	requireRoot(t)
	b := bins(t)
	runDir, err := os.MkdirTemp("/run", "sbxe-")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := &daemon{
		t: t, bin: b, stateDir: filepath.Join(dir, "state"), runDir: runDir,
		socket: filepath.Join(runDir, "api.sock"), httpAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		tokenFile: filepath.Join(dir, "token"), cgroup: "/mcp-sandboxd-e2e-" + randHex(4),
		cfgPath: filepath.Join(dir, "mcp-sandboxd.yaml"), logPath: filepath.Join(dir, "daemon.log"),
	}
	cfg := fmt.Sprintf(`server:
  socket: %s
  http_addr: %s
  auth_token_file: %s
paths:
  state_dir: %s
  run_dir: %s
  images_dir: %s
  recipes_dir: %s
  seccomp_dir: %s
  agent_path: %s
sandbox:
  cgroup_parent: %s
  memory: 256M
  disk: 128M
log:
  level: debug
`, d.socket, d.httpAddr, d.tokenFile, d.stateDir, runDir, testImagesDir(),
		filepath.Join(repoRoot, "rootfs"), filepath.Join(repoRoot, "seccomp-profiles"),
		filepath.Join(b, "sandbox-agent"), d.cgroup)
	if err := os.WriteFile(d.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The shell image is built once per cache; later runs find it by digest.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, filepath.Join(b, "mcp-sandboxd"), "images", "build", "--config", d.cfgPath, "shell").CombinedOutput(); err != nil {
		t.Fatalf("build shell image: %v\n%s", err, out)
	}
	t.Cleanup(d.cleanup)
	return d
}

// start runs serve and waits until the API answers.
func (d *daemon) start() {
	d.t.Helper()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	daemonBin := filepath.Join(d.bin, "mcp-sandboxd")
	if d.daemonBin != "" {
		daemonBin = d.daemonBin
	}
	d.cmd = exec.Command(daemonBin, "serve", "--config", d.cfgPath)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.Env = append(os.Environ(), d.extraEnv...)
	// Its own process group, so that killing it never reaches the test.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	logf.Close()
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		d.exitErr = cmd.Wait()
		close(done)
	}(d.cmd, d.exited)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.exited:
			d.t.Fatalf("daemon exited during start: %v\n%s", d.exitErr, d.log())
		default:
		}
		if res, err := d.unixGet("/healthz"); err == nil && res.StatusCode == 200 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.t.Fatalf("daemon did not answer within 60s\n%s", d.log())
}

func (d *daemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(40 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return errors.New("daemon ignored SIGTERM for 40s")
	}
	d.cmd = nil
	return d.exitErr
}

// crash kills the daemon with SIGKILL, as a crash would.
func (d *daemon) crash() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

func (d *daemon) cleanup() {
	t := d.t
	if d.cmd == nil {
		d.start()
	}
	// Terminate whatever the test left, then stop the daemon and check that
	// no sandbox left anything behind.
	for _, id := range d.liveIDs() {
		d.ctl("rm", "-f", id)
	}
	if err := d.stop(); err != nil {
		t.Errorf("daemon stop: %v\n%s", err, d.log())
	}
	d.assertNoLeftovers()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(d.cgroup, "/")))
	for _, dir := range append(dirs, filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(d.cgroup, "/"))) {
		_ = os.Remove(dir)
	}
	_ = os.RemoveAll(d.runDir)
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.log())
	}
}

func (d *daemon) assertNoLeftovers() {
	t := d.t
	t.Helper()
	cg, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.TrimPrefix(d.cgroup, "/"), "sb-*"))
	for _, c := range cg {
		t.Errorf("leftover cgroup %s", c)
	}
	for _, m := range mountsUnder(d.runDir) {
		t.Errorf("leftover mount %s", m)
	}
	for _, sub := range []string{"runtime", "sandboxes"} {
		ents, _ := os.ReadDir(filepath.Join(d.runDir, sub))
		for _, e := range ents {
			t.Errorf("leftover %s/%s", sub, e.Name())
		}
	}
}

func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

// liveIDs lists the live sandboxes (sandboxctl ps --json).
func (d *daemon) liveIDs() []string {
	out, _, code := d.ctl("ps", "--json")
	var list []struct {
		ID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 {
		d.t.Errorf("sandboxctl ps --json: exit %d, %v: %q", code, err, out)
	}
	ids := make([]string, 0, len(list))
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids
}

// ctl runs sandboxctl against the daemon's socket.
func (d *daemon) ctl(args ...string) (stdout, stderr string, code int) {
	return d.ctlIn(nil, args...)
}

func (d *daemon) ctlIn(stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(filepath.Join(d.bin, "sandboxctl"), append([]string{"--socket", d.socket}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &o, &e, stdin
	err := cmd.Run()
	code = 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("run sandboxctl: %v", err)
	}
	return o.String(), e.String(), code
}

// mustCtl runs sandboxctl and fails the test on a non-zero exit.
func (d *daemon) mustCtl(args ...string) string {
	d.t.Helper()
	out, errOut, code := d.ctl(args...)
	if code != 0 {
		d.t.Fatalf("sandboxctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func (d *daemon) unixClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.socket)
	}}, Timeout: 30 * time.Second}
}

func (d *daemon) unixGet(path string) (*http.Response, error) {
	res, err := d.unixClient().Get("http://daemon" + path)
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(body))
	return res, nil
}

func (d *daemon) token() string {
	b, err := os.ReadFile(d.tokenFile)
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
