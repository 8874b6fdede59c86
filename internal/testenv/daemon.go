package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// Daemon is one `mcp-sandboxd serve` process on private state, driven from
// outside like an administrator would: through sandboxctl and HTTP.
type Daemon struct {
	T         testing.TB
	Bin       string // directory of the three binaries
	DaemonBin string // overrides Bin/mcp-sandboxd (e.g. a build without seccomp)
	Config    *config.Config
	CfgPath   string
	Socket    string
	HTTPAddr  string
	LogPath   string
	ExtraEnv  []string // added to the daemon's environment
	// Wrapper is run with the daemon's command line as its arguments and
	// must exec it (e.g. nsenter --net=NS: a daemon whose network host side
	// lives in the test's own namespace). Kept across restarts.
	Wrapper []string

	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
}

// NewDaemon writes a configuration on private state (see Config), builds the
// named images into the shared cache, and registers a cleanup that removes
// every sandbox, stops the daemon and checks that nothing was left behind.
// Call Start to run it.
func NewDaemon(t testing.TB, images ...string) *Daemon {
	t.Helper()
	cfg := Config(t, "e2e")
	dir := t.TempDir()
	addr := FreeAddr(t)
	cfg.Server.Socket = filepath.Join(cfg.Paths.RunDir, "api.sock")
	cfg.Server.HTTPAddr = addr
	cfg.Server.AuthTokenFile = filepath.Join(dir, "token")
	cfg.Log.Level = "debug"
	d := &Daemon{
		T: t, Bin: BinDir(t), Config: cfg, Socket: cfg.Server.Socket, HTTPAddr: addr,
		CfgPath: filepath.Join(dir, "mcp-sandboxd.yaml"), LogPath: filepath.Join(dir, "daemon.log"),
	}
	data, err := config.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	EnsureImages(t, append([]string{"shell"}, images...)...)
	t.Cleanup(d.cleanup)
	return d
}

// Start runs serve and waits until the API answers.
func (d *Daemon) Start() {
	t := d.T
	t.Helper()
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(d.Bin, "mcp-sandboxd")
	if d.DaemonBin != "" {
		bin = d.DaemonBin
	}
	argv := append(slices.Clone(d.Wrapper), bin, "serve", "--config", d.CfgPath)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.Env = append(os.Environ(), d.ExtraEnv...)
	// Its own process group, so that signals for it never reach the test.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		d.exitErr = cmd.Wait()
		close(done)
	}(d.cmd, d.exited)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-d.exited:
			t.Fatalf("daemon exited during start: %v\n%s", d.exitErr, d.Log())
		default:
		}
		if res, err := d.UnixGet("/healthz"); err == nil && res.StatusCode == http.StatusOK {
			return
		}
	}
	t.Fatalf("daemon did not answer within 60s\n%s", d.Log())
}

// Log returns the tail of the daemon's log.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.LogPath)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// Stop sends SIGTERM and waits for the daemon to exit; it returns how it exited.
func (d *Daemon) Stop() error {
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	defer func() { d.cmd = nil }()
	select {
	case <-d.exited:
		return d.exitErr
	case <-time.After(40 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return errors.New("daemon ignored SIGTERM for 40s")
	}
}

// Crash kills the daemon with SIGKILL, as a crash would.
func (d *Daemon) Crash() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

func (d *Daemon) cleanup() {
	t := d.T
	if d.cmd == nil {
		d.DaemonBin = ""
		d.Start()
	}
	// Sandboxes outlive the daemon by design: remove them first.
	for _, id := range d.LiveIDs() {
		d.Ctl("rm", "-f", id)
	}
	if err := d.Stop(); err != nil {
		t.Errorf("daemon stop: %v", err)
	}
	AssertNoLeftovers(t, d.Config)
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.Log())
	}
}

// LiveIDs lists the live sandboxes (sandboxctl ps --json).
func (d *Daemon) LiveIDs() []string {
	out, _, code := d.Ctl("ps", "--json")
	var list []struct {
		ID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 {
		d.T.Errorf("sandboxctl ps --json: exit %d, %v: %q", code, err, out)
	}
	ids := make([]string, 0, len(list))
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids
}

// Ctl runs sandboxctl against the daemon's socket.
func (d *Daemon) Ctl(args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(filepath.Join(d.Bin, "sandboxctl"), append([]string{"--socket", d.Socket}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		d.T.Fatalf("run sandboxctl: %v", err)
	}
	return o.String(), e.String(), code
}

// MustCtl runs sandboxctl and fails the test on a non-zero exit.
func (d *Daemon) MustCtl(args ...string) string {
	d.T.Helper()
	out, errOut, code := d.Ctl(args...)
	if code != 0 {
		d.T.Fatalf("sandboxctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// UnixGet sends GET path to the daemon's unix socket; the body is read into memory.
func (d *Daemon) UnixGet(path string) (*http.Response, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.Socket)
		},
	}}
	// Its connection is closed with it: a kept-alive one per call would
	// stay open in the daemon (make soak counts the daemon's descriptors).
	defer c.CloseIdleConnections()
	res, err := c.Get("http://daemon" + path)
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(body))
	return res, nil
}

// Token returns the HTTP bearer token (created by the daemon on first start).
func (d *Daemon) Token() string {
	b, err := os.ReadFile(d.Config.Server.AuthTokenFile)
	if err != nil {
		d.T.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// PID returns the running daemon's process id.
func (d *Daemon) PID() int {
	if d.cmd == nil || d.cmd.Process == nil {
		d.T.Fatal("daemon not started")
	}
	return d.cmd.Process.Pid
}
