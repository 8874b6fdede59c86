package sshd_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
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
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// sshEnv is a real daemon with its SSH endpoint on, a registered key, an
// ssh_config written by sandboxctl ssh-config, and Debian's OpenSSH
// client and rsync to drive it.
type sshEnv struct {
	t      *testing.T
	d      *testenv.Daemon
	dir    string
	cfg    string // ssh_config file (sandboxctl ssh-config)
	key    string // private key file, registered
	signer ssh.Signer
	addr   string // ssh.listen
	hostPK ssh.PublicKey
}

func newSSHEnv(t *testing.T) *sshEnv {
	testenv.RequireRoot(t)
	for _, tool := range []string{"ssh", "scp", "sftp", "ssh-keygen", "rsync", "tmux", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s is not installed (scripts/install-deps.sh installs openssh-client and rsync)", tool)
		}
	}
	d := testenv.NewDaemon(t)
	addr := testenv.FreeAddr(t)
	d.Config.SSH.Listen = addr
	d.Config.SSH.Keepalive = config.Duration(2 * time.Second)
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	e := &sshEnv{t: t, d: d, dir: t.TempDir(), addr: addr}
	e.key = filepath.Join(e.dir, "id_ed25519")
	run(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test@sshd", "-f", e.key)
	out := d.MustCtl("ssh-keys", "add", e.key+".pub")
	if !strings.Contains(out, "SHA256:") {
		t.Fatalf("ssh-keys add printed %q, want the fingerprint", out)
	}
	pem, err := os.ReadFile(e.key)
	if err != nil {
		t.Fatal(err)
	}
	if e.signer, err = ssh.ParsePrivateKey(pem); err != nil {
		t.Fatal(err)
	}
	return e
}

// create starts a shell sandbox and writes the ssh_config for the live ones.
func (e *sshEnv) create(args ...string) string {
	e.t.Helper()
	out := e.d.MustCtl(append([]string{"create", "--lang", "shell", "--json"}, args...)...)
	var sb apitypes.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		e.t.Fatalf("create: %v: %s", err, out)
	}
	e.writeConfig(sb.ID)
	return sb.ID
}

// writeConfig writes the ssh_config sandboxctl ssh-config prints for the
// live sandboxes, checking it has id's block.
func (e *sshEnv) writeConfig(id string) {
	e.t.Helper()
	e.cfg = filepath.Join(e.dir, "ssh_config")
	conf := e.d.MustCtl("ssh-config", "--known-hosts", filepath.Join(e.dir, "known_hosts"), "--identity", e.key)
	if !strings.Contains(conf, "Host "+id) || !strings.Contains(conf, "StrictHostKeyChecking yes") {
		e.t.Fatalf("ssh-config printed no block for %s:\n%s", id, conf)
	}
	if err := os.WriteFile(e.cfg, []byte(conf+"Host *\n  BatchMode yes\n  LogLevel ERROR\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

type result struct {
	stdout, stderr string
	code           int
}

// cmd runs name with args under a bound, with stdin.
func (e *sshEnv) cmd(stdin io.Reader, name string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, name, args...)
	var o, er bytes.Buffer
	c.Stdin, c.Stdout, c.Stderr = stdin, &o, &er
	err := c.Run()
	r := result{stdout: o.String(), stderr: er.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("%s: %v", name, err)
	}
	return r
}

// ssh runs OpenSSH's ssh with the ssh_config sandboxctl wrote.
func (e *sshEnv) ssh(args ...string) result {
	e.t.Helper()
	return e.cmd(nil, "ssh", append([]string{"-F", e.cfg}, args...)...)
}

func (e *sshEnv) mustSSH(args ...string) string {
	e.t.Helper()
	r := e.ssh(args...)
	if r.code != 0 {
		e.t.Fatalf("ssh %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// goClient logs in with x/crypto's client (for what OpenSSH has no flag
// for: channel signals, raw refusals), checking the host key.
func (e *sshEnv) goClient(user string, auth ...ssh.AuthMethod) (*ssh.Client, error) {
	if e.hostPK == nil {
		res, err := e.d.UnixGet("/v1/ssh")
		if err != nil {
			e.t.Fatal(err)
		}
		var ep apitypes.SSHEndpoint
		if err := json.NewDecoder(res.Body).Decode(&ep); err != nil {
			e.t.Fatal(err)
		}
		if e.hostPK, _, _, _, err = ssh.ParseAuthorizedKey([]byte(ep.HostKey)); err != nil {
			e.t.Fatalf("host key %q: %v", ep.HostKey, err)
		}
	}
	if len(auth) == 0 {
		auth = []ssh.AuthMethod{ssh.PublicKeys(e.signer)}
	}
	return ssh.Dial("tcp", e.addr, &ssh.ClientConfig{User: user, Auth: auth, HostKeyCallback: ssh.FixedHostKey(e.hostPK), Timeout: 30 * time.Second})
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func randomFile(t *testing.T, p string, size int) {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or the bound passes.
func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within %s", what, bound)
}

func TestSSH(t *testing.T) {
	e := newSSHEnv(t)
	id := e.create()

	t.Run("exec exit codes", func(t *testing.T) {
		if out := e.mustSSH(id, "echo out; echo err >&2; id -un; pwd"); out != "out\nsandbox\n/workspace\n" {
			t.Errorf("stdout = %q", out)
		}
		r := e.ssh(id, "echo err >&2")
		if r.stderr != "err\n" || r.stdout != "" {
			t.Errorf("stderr not apart: stdout %q stderr %q", r.stdout, r.stderr)
		}
		for cmd, want := range map[string]int{"true": 0, "false": 1, "exit 7": 7, "kill -9 $$": 137} {
			if r := e.ssh(id, cmd); r.code != want {
				t.Errorf("ssh %s %q: exit %d, want %d (stderr %q)", id, cmd, r.code, want, r.stderr)
			}
		}
	})

	t.Run("stdin EOF", func(t *testing.T) {
		r := e.cmd(strings.NewReader("line one\nline two\n"), "ssh", "-F", e.cfg, id, "cat; echo after-eof")
		if r.code != 0 || r.stdout != "line one\nline two\nafter-eof\n" {
			t.Errorf("exit %d, stdout %q", r.code, r.stdout)
		}
	})

	t.Run("environment allow-list", func(t *testing.T) {
		out := e.mustSSH("-o", "SetEnv=LC_TIME=C.UTF-8 LD_PRELOAD=/tmp/evil.so", id, `echo "$LC_TIME|${LD_PRELOAD-unset}"`)
		if out != "C.UTF-8|unset\n" {
			t.Errorf("got %q, want LC_TIME passed and LD_PRELOAD refused", out)
		}
	})

	t.Run("tty shell in tmux", func(t *testing.T) {
		sock := filepath.Join(e.dir, "tmux.sock")
		tmux := func(args ...string) string {
			return run(t, "tmux", append([]string{"-S", sock}, args...)...)
		}
		tmux("new-session", "-d", "-s", "ssh", "-x", "100", "-y", "30", "ssh -F "+e.cfg+" -tt "+id)
		defer exec.Command("tmux", "-S", sock, "kill-server").Run()
		screen := func() string { return tmux("capture-pane", "-p", "-t", "ssh") }
		tmux("send-keys", "-t", "ssh", "stty size; tty; echo MARK$((40+2))", "Enter")
		waitFor(t, "the shell's answer", 30*time.Second, func() bool {
			s := screen()
			return strings.Contains(s, "MARK42") && strings.Contains(s, "30 100") && strings.Contains(s, "/dev/pts/")
		})
		// A window change reaches the terminal in the sandbox.
		tmux("resize-window", "-t", "ssh", "-x", "120", "-y", "40")
		tmux("send-keys", "-t", "ssh", "clear; stty size", "Enter")
		waitFor(t, "the new size", 30*time.Second, func() bool { return strings.Contains(screen(), "40 120") })
		// ^C is the terminal's: it interrupts the foreground command.
		tmux("send-keys", "-t", "ssh", "clear; sleep 100", "Enter")
		waitFor(t, "sleep started", 30*time.Second, func() bool {
			return strings.Contains(e.mustSSH(id, "ps -eo args"), "sleep 100")
		})
		tmux("send-keys", "-t", "ssh", "C-c")
		tmux("send-keys", "-t", "ssh", "echo rc=$?", "Enter")
		waitFor(t, "sleep interrupted", 30*time.Second, func() bool { return strings.Contains(screen(), "rc=130") })
		tmux("send-keys", "-t", "ssh", "exit 3", "Enter")
		waitFor(t, "the session's end", 30*time.Second, func() bool {
			return exec.Command("tmux", "-S", sock, "has-session", "-t", "ssh").Run() != nil
		})
	})

	t.Run("signal request", func(t *testing.T) {
		c, err := e.goClient(id)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		out, _ := s.StdoutPipe()
		if err := s.Start("echo started; exec sleep 100"); err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 8)
		if _, err := io.ReadFull(out, line); err != nil || string(line) != "started\n" {
			t.Fatalf("read %q: %v", line, err)
		}
		if err := s.Signal(ssh.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var ee *ssh.ExitError
		if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 143 {
			t.Errorf("wait after SIGTERM = %v, want exit status 143", err)
		}
	})

	t.Run("scp 20 MiB both ways", func(t *testing.T) {
		src := filepath.Join(e.dir, "big")
		randomFile(t, src, 20<<20)
		want := sha256File(t, src)
		run(t, "scp", "-F", e.cfg, src, id+":/workspace/big")
		if got := strings.Fields(e.mustSSH(id, "sha256sum /workspace/big"))[0]; got != want {
			t.Fatalf("sandbox's copy has %s, want %s", got, want)
		}
		back := filepath.Join(e.dir, "back")
		run(t, "scp", "-F", e.cfg, id+":big", back) // relative: /workspace
		if got := sha256File(t, back); got != want {
			t.Fatalf("copy back has %s, want %s", got, want)
		}
	})

	t.Run("sftp batch", func(t *testing.T) {
		src := filepath.Join(e.dir, "small")
		if err := os.WriteFile(src, []byte("hello sftp\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		got := filepath.Join(e.dir, "got")
		batch := filepath.Join(e.dir, "batch")
		script := fmt.Sprintf("mkdir d\nput %s d/a\nrename d/a d/b\nls d\nget d/b %s\nrm d/b\nrmdir d\nls\n", src, got)
		if err := os.WriteFile(batch, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		out := run(t, "sftp", "-F", e.cfg, "-b", batch, id)
		if b, err := os.ReadFile(got); err != nil || string(b) != "hello sftp\n" {
			t.Errorf("got %q, %v", b, err)
		}
		if !strings.Contains(out, "d/b") {
			t.Errorf("ls d does not show the renamed file:\n%s", out)
		}
		if r := e.ssh(id, "test -e /workspace/d"); r.code != 1 {
			t.Errorf("d still exists after rmdir (exit %d)", r.code)
		}
		// An error is the server's message, and fails the batch.
		if err := os.WriteFile(batch, []byte("get /nonexistent "+got+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e.cmd(nil, "sftp", "-F", e.cfg, "-b", batch, id)
		if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "not found") && !strings.Contains(r.stderr+r.stdout, "No such file") {
			t.Errorf("get of a missing file: exit %d, %q %q", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("rsync twice", func(t *testing.T) {
		tree := filepath.Join(e.dir, "tree")
		for i := range 20 {
			p := filepath.Join(tree, fmt.Sprintf("sub%d", i%3), fmt.Sprintf("f%d", i))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			randomFile(t, p, 1000*(i+1))
		}
		if err := os.Symlink("sub0/f0", filepath.Join(tree, "link")); err != nil {
			t.Fatal(err)
		}
		rsync := func() string {
			return run(t, "rsync", "-a", "--itemize-changes", "-e", "ssh -F "+e.cfg, tree+"/", id+":/workspace/tree/")
		}
		first := rsync()
		if n := strings.Count(first, "<f+++++++++"); n != 20 {
			t.Errorf("first rsync sent %d new files, want 20:\n%s", n, first)
		}
		if second := rsync(); strings.TrimSpace(second) != "" {
			t.Errorf("second rsync transferred something:\n%s", second)
		}
		local := run(t, "sh", "-c", "cd "+tree+" && find . -type f -exec sha256sum {} + | sort")
		remote := e.mustSSH(id, "cd /workspace/tree && find . -type f -exec sha256sum {} + | sort")
		if local != remote {
			t.Errorf("trees differ:\nlocal\n%s\nsandbox\n%s", local, remote)
		}
		if got := strings.TrimSpace(e.mustSSH(id, "readlink /workspace/tree/link")); got != "sub0/f0" {
			t.Errorf("symlink = %q", got)
		}
	})

	t.Run("ssh -L to an HTTP server", func(t *testing.T) {
		srv := buildHTTPServer(t, e.dir)
		run(t, "scp", "-F", e.cfg, srv, id+":/workspace/httpd")
		e.mustSSH(id, "chmod +x /workspace/httpd")
		// The server runs in the background of its own session.
		bg := exec.Command("ssh", "-F", e.cfg, id, "exec /workspace/httpd 127.0.0.1:8099")
		var bgErr bytes.Buffer
		bg.Stderr = &bgErr
		if err := bg.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = bg.Process.Kill(); _ = bg.Wait() }()
		local := testenv.FreeAddr(t)
		fwd := exec.Command("ssh", "-F", e.cfg, "-N", "-o", "ExitOnForwardFailure=yes", "-L", local+":localhost:8099", id)
		if err := fwd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = fwd.Process.Kill(); _ = fwd.Wait() }()
		var body string
		waitFor(t, "HTTP through ssh -L", 60*time.Second, func() bool {
			res, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + local + "/hello")
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			body = string(b)
			return res.StatusCode == 200
		})
		if body != "sandbox says hello to /hello\n" {
			t.Errorf("body %q", body)
		}
		// A destination off the sandbox's loopback is refused.
		c, err := e.goClient(id)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if conn, err := c.Dial("tcp", "10.0.0.1:80"); err == nil || !strings.Contains(err.Error(), "only the sandbox's own ports") {
			if conn != nil {
				conn.Close()
			}
			t.Errorf("dial 10.0.0.1:80 through the sandbox = %v, want refused", err)
		}
	})

	t.Run("keep-alive", func(t *testing.T) {
		// The endpoint checks every 2s; a live client answers, so a
		// session idle for longer survives.
		if out := e.mustSSH("-o", "ServerAliveInterval=1", id, "sleep 5; echo alive"); out != "alive\n" {
			t.Errorf("got %q", out)
		}
	})

	t.Run("token", func(t *testing.T) {
		r := e.cmd(nil, filepath.Join(e.d.Bin, "sandboxctl"), "--socket", e.d.Socket, "ssh", id, "--", "-o", "LogLevel=ERROR", "echo via-token; exit 4")
		if r.code != 4 || r.stdout != "via-token\n" {
			t.Errorf("sandboxctl ssh: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		// A token is single-use.
		tok := e.mintToken(id, 0)
		c, err := e.goClient(id, tokenAuth(tok.Token))
		if err != nil {
			t.Fatalf("first use: %v", err)
		}
		c.Close()
		if _, err := e.goClient(id, tokenAuth(tok.Token)); err == nil {
			t.Error("a token logged in twice")
		}
		// And valid only for its sandbox.
		tok = e.mintToken(id, 0)
		if _, err := e.goClient(id+"+root", tokenAuth(tok.Token)); err == nil {
			t.Error("a token of the sandbox user logged in as root")
		}
		// Minting validates: a lifetime over an hour, an unknown sandbox.
		if status, body := e.postToken(id, 7200); status != 400 || !strings.Contains(string(body), "ttl_seconds") {
			t.Errorf("ttl 7200: %d %s", status, body)
		}
		if status, body := e.postToken("sb-000000000000", 0); status != 404 {
			t.Errorf("unknown sandbox: %d %s", status, body)
		}
		// An expired token is refused, and the client is told why.
		tok = e.mintToken(id, 0.3)
		time.Sleep(time.Until(tok.ExpiresAt) + 100*time.Millisecond) // the expiry itself is under test
		var banner strings.Builder
		_, err = ssh.Dial("tcp", e.addr, &ssh.ClientConfig{User: id, Auth: []ssh.AuthMethod{tokenAuth(tok.Token)},
			HostKeyCallback: ssh.FixedHostKey(e.hostPK), Timeout: 30 * time.Second,
			BannerCallback: func(m string) error { banner.WriteString(m); return nil }})
		if err == nil || !strings.Contains(banner.String(), "token refused: token: expired") {
			t.Errorf("expired token: %v, banner %q", err, banner.String())
		}
	})

	t.Run("refusals", func(t *testing.T) {
		// Password authentication is never offered: the client is told.
		askpass := filepath.Join(e.dir, "askpass")
		if err := os.WriteFile(askpass, []byte("#!/bin/sh\necho hunter2\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		pc := exec.Command("ssh", "-F", e.cfg, "-o", "BatchMode=no", "-o", "PreferredAuthentications=password", "-o", "LogLevel=INFO", id, "true")
		pc.Env = append(os.Environ(), "SSH_ASKPASS="+askpass, "SSH_ASKPASS_REQUIRE=force")
		out, err := pc.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "password authentication is not offered") {
			t.Errorf("password login: %v\n%s", err, out)
		}
		if _, err := e.goClient(id, ssh.Password("hunter2")); err == nil {
			t.Error("password login succeeded")
		}
		// An unknown sandbox, with a valid key: told, nothing started.
		r := e.ssh("-o", "LogLevel=INFO", "-l", "sb-000000000000", id, "true")
		if r.code != 255 || !strings.Contains(r.stderr, `no sandbox "sb-000000000000"`) {
			t.Errorf("unknown sandbox: exit %d, stderr %q", r.code, r.stderr)
		}
		// A user that names no sandbox.
		if r := e.ssh("-o", "LogLevel=INFO", "-l", "root", id, "true"); r.code != 255 || !strings.Contains(r.stderr, "must be a sandbox id") {
			t.Errorf("user root: exit %d, stderr %q", r.code, r.stderr)
		}
		// A key nobody registered.
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		os2, _ := ssh.NewSignerFromKey(other)
		if _, err := e.goClient(id, ssh.PublicKeys(os2)); err == nil {
			t.Error("an unregistered key logged in")
		}
		// Root of a sandbox not in root mode.
		if r := e.ssh("-o", "LogLevel=INFO", "-l", id+"+root", id, "id -u"); r.code != 255 || !strings.Contains(r.stderr, "root mode") {
			t.Errorf("root login: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		// A key that is not one is refused by the API, naming the field.
		bad := filepath.Join(e.dir, "bad.pub")
		if err := os.WriteFile(bad, []byte("ssh-ed25519 AAAA-not-base64 x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, errOut, code := e.d.Ctl("ssh-keys", "add", bad); code != 2 || !strings.Contains(errOut, "public_key:") {
			t.Errorf("ssh-keys add of garbage: exit %d, %q %q", code, out, errOut)
		}
		// Every refusal above left an audit line.
		log, err := os.ReadFile(e.d.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"method=password", "method=publickey reason=\"sandbox: sandbox_id: no sandbox"} {
			if !strings.Contains(string(log), `msg="ssh login refused"`) || !strings.Contains(string(log), want) {
				t.Errorf("daemon log has no refusal with %s", want)
			}
		}
		// ... and a record in the audit log, as the logins did.
		files, _ := filepath.Glob(filepath.Join(e.d.Config.Paths.StateDir, "audit", "audit-*.jsonl"))
		var records string
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			records += string(b)
		}
		for _, want := range []string{
			`"front_end":"ssh","source":`, `"action":"ssh login (password)"`, `"outcome":"failure","code":"unauthenticated"`,
			`"action":"ssh login (publickey)","target":"` + id + `","outcome":"success"`,
		} {
			if !strings.Contains(records, want) {
				t.Errorf("the audit log (%d files) has no ssh record with %s", len(files), want)
			}
		}
		if out, errOut, code := e.d.Ctl("audit", "verify"); code != 0 {
			t.Errorf("audit verify after the ssh logins: exit %d %s %s", code, out, errOut)
		}
		// Agent and X11 forwarding: refused, and the session says so.
		c, err := e.goClient(id)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.SendRequest("auth-agent-req@openssh.com", true, nil); ok || err != nil {
			t.Errorf("agent forwarding request: ok %v, err %v", ok, err)
		}
		x11 := ssh.Marshal(struct {
			Single        bool
			Proto, Cookie string
			Screen        uint32
		}{false, "MIT-MAGIC-COOKIE-1", "00", 0})
		if ok, err := s.SendRequest("x11-req", true, x11); ok || err != nil {
			t.Errorf("X11 request: ok %v, err %v", ok, err)
		}
		var stderr bytes.Buffer
		s.Stderr = &stderr
		if err := s.Run("true"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr.String(), "agent forwarding is refused") || !strings.Contains(stderr.String(), "X11 forwarding is refused") {
			t.Errorf("stderr %q", stderr.String())
		}
		// Remote forwarding.
		if _, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
			t.Error("remote forwarding was granted")
		}
		r = e.ssh("-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9", id, "true")
		if r.code != 255 || !strings.Contains(r.stderr, "remote port forwarding failed") {
			t.Errorf("ssh -R: exit %d, stderr %q", r.code, r.stderr)
		}
	})

	t.Run("another tenant's key", func(t *testing.T) {
		// bob, a user key of his own tenant, registers an SSH key with it.
		var bob apitypes.KeySecret
		if err := json.Unmarshal([]byte(e.d.MustCtl("keys", "create", "bob", "--json")), &bob); err != nil || bob.Secret == "" {
			t.Fatalf("keys create bob: %v %+v", err, bob)
		}
		_, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		bobSigner, err := ssh.NewSignerFromKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		rest := func(method, path string, body any, out any) {
			t.Helper()
			b, _ := json.Marshal(body)
			req, _ := http.NewRequest(method, "http://"+e.d.HTTPAddr+path, bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+bob.Secret)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			data, _ := io.ReadAll(res.Body)
			if res.StatusCode/100 != 2 {
				t.Fatalf("%s %s as bob: %d %s", method, path, res.StatusCode, data)
			}
			if out != nil {
				if err := json.Unmarshal(data, out); err != nil {
					t.Fatalf("%s %s: %v: %s", method, path, err, data)
				}
			}
		}
		rest(http.MethodPost, "/v1/ssh/keys", apitypes.SSHKeyAddRequest{Name: "bob-laptop", PublicKey: string(ssh.MarshalAuthorizedKey(bobSigner.PublicKey()))}, nil)
		var own apitypes.Sandbox
		rest(http.MethodPost, "/v1/sandboxes", apitypes.CreateSandboxRequest{Language: "shell"}, &own)

		// His key opens his own sandbox ...
		c, err := e.goClient(own.ID, ssh.PublicKeys(bobSigner))
		if err != nil {
			t.Fatalf("bob into his own sandbox: %v", err)
		}
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if out, err := sess.Output("echo mine"); err != nil || string(out) != "mine\n" {
			t.Errorf("bob's command in his sandbox: %q %v", out, err)
		}
		c.Close()
		// ... and not the administrator's, which is not found for him,
		// exactly as a sandbox that does not exist.
		other := e.create()
		if c, err := e.goClient(other, ssh.PublicKeys(bobSigner)); err == nil {
			c.Close()
			t.Fatalf("bob's key opened %s, a sandbox of another tenant", other)
		}
		log, err := os.ReadFile(e.d.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		refused := false
		for _, l := range strings.Split(string(log), "\n") {
			refused = refused || strings.Contains(l, `msg="ssh login refused"`) && strings.Contains(l, "user="+other+" ") &&
				strings.Contains(l, "reason=\"sandbox: sandbox_id: no sandbox")
		}
		if !refused {
			t.Errorf("the daemon log has no refusal of bob's login to %s as a sandbox that does not exist", other)
		}
	})

	t.Run("ssh-proxy through the API", func(t *testing.T) {
		// What ssh-config --proxy writes: ssh reaches the endpoint
		// through sandboxctl ssh-proxy and the daemon's API socket.
		conf := e.d.MustCtl("ssh-config", "--proxy", "--known-hosts", filepath.Join(e.dir, "known_hosts"), "--identity", e.key, id)
		if !strings.Contains(conf, "ProxyCommand "+filepath.Join(e.d.Bin, "sandboxctl")+" --socket") || !strings.Contains(conf, " ssh-proxy --sandbox "+id+"\n") || strings.Contains(conf, "HostName") {
			t.Fatalf("ssh-config --proxy:\n%s", conf)
		}
		pcfg := filepath.Join(e.dir, "proxy_config")
		if err := os.WriteFile(pcfg, []byte(conf+"Host *\n  BatchMode yes\n  LogLevel ERROR\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e.cmd(nil, "ssh", "-F", pcfg, id, "echo proxied; exit 5")
		if r.code != 5 || r.stdout != "proxied\n" {
			t.Errorf("through ssh-proxy: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("benchmark", func(t *testing.T) {
		// ssh ID true, round trip (a new connection each: what a tool
		// calling ssh pays), and 20 MiB each way by scp and by the REST
		// file API (sandboxctl cp), in one run.
		var rtts []time.Duration
		for range 10 {
			start := time.Now()
			e.mustSSH(id, "true")
			rtts = append(rtts, time.Since(start))
		}
		slices.Sort(rtts)
		src := filepath.Join(e.dir, "bench")
		randomFile(t, src, 20<<20)
		ctl := filepath.Join(e.d.Bin, "sandboxctl")
		timed := func(name string, args ...string) time.Duration {
			best := time.Duration(1<<63 - 1)
			for range 3 {
				start := time.Now()
				run(t, name, args...)
				best = min(best, time.Since(start))
			}
			return best
		}
		mibps := func(d time.Duration) float64 { return 20 / d.Seconds() }
		scpUp := timed("scp", "-F", e.cfg, src, id+":/workspace/bench-scp")
		scpDown := timed("scp", "-F", e.cfg, id+":/workspace/bench-scp", filepath.Join(e.dir, "bench-scp"))
		restUp := timed(ctl, "--socket", e.d.Socket, "cp", src, id+":/workspace/bench-rest")
		restDown := timed(ctl, "--socket", e.d.Socket, "cp", id+":/workspace/bench-rest", filepath.Join(e.dir, "bench-rest"))
		want := sha256File(t, src)
		for _, p := range []string{"bench-scp", "bench-rest"} {
			if got := sha256File(t, filepath.Join(e.dir, p)); got != want {
				t.Errorf("%s came back as %s, want %s", p, got, want)
			}
		}
		t.Logf("ssh ID true: median %v, min %v, max %v (10 connections)", rtts[5], rtts[0], rtts[9])
		t.Logf("20 MiB upload:   scp %.0f MiB/s, REST (sandboxctl cp) %.0f MiB/s", mibps(scpUp), mibps(restUp))
		t.Logf("20 MiB download: scp %.0f MiB/s, REST (sandboxctl cp) %.0f MiB/s", mibps(scpDown), mibps(restDown))
		// Bounds loose enough for a loaded 2-core machine: they catch a
		// per-chunk round trip or a stall, not a few percent.
		if rtts[5] > 2*time.Second {
			t.Errorf("ssh ID true takes %v", rtts[5])
		}
		if mibps(scpUp) < 5 || mibps(scpDown) < 5 {
			t.Errorf("scp moves %.1f MiB/s up, %.1f down", mibps(scpUp), mibps(scpDown))
		}
	})

	t.Run("VM with our agent", func(t *testing.T) {
		// A VM sandbox (the Linux test guest: busybox, our agent over
		// virtio-serial) is served the same way: sessions, exit codes,
		// stdin, SFTP.
		vmID := strings.TrimSpace(e.d.MustCtl("create", "--backend", "vm"))
		defer e.d.Ctl("rm", "-f", vmID)
		e.writeConfig(vmID)
		if r := e.ssh(vmID, "uname -s; exit 3"); r.code != 3 || r.stdout != "Linux\n" {
			t.Errorf("ssh into the VM: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := e.cmd(strings.NewReader("to the vm\n"), "ssh", "-F", e.cfg, vmID, "cat > /workspace/in; cat /workspace/in"); r.code != 0 || r.stdout != "to the vm\n" {
			t.Errorf("stdin into the VM: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		src := filepath.Join(e.dir, "vm-file")
		randomFile(t, src, 1<<20)
		run(t, "scp", "-F", e.cfg, src, vmID+":/workspace/vm-file")
		back := filepath.Join(e.dir, "vm-file-back")
		run(t, "scp", "-F", e.cfg, vmID+":/workspace/vm-file", back)
		if sha256File(t, back) != sha256File(t, src) {
			t.Error("scp through the VM changed the file")
		}
	})

	t.Run("sandbox terminated during a session", func(t *testing.T) {
		victim := e.create()
		c := exec.Command("ssh", "-F", e.cfg, victim, "echo ready; exec sleep 300")
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		waitFor(t, "the session's start", 30*time.Second, func() bool { return strings.Contains(stdout.String(), "ready") })
		e.d.MustCtl("rm", "-f", victim)
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 255 {
				t.Errorf("ssh ended with %v, want exit 255", err)
			}
			if !strings.Contains(stderr.String(), "terminated") {
				t.Errorf("stderr %q does not say the sandbox was terminated", stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = c.Process.Kill()
			t.Fatal("ssh still runs 30s after its sandbox was terminated")
		}
		if ids := e.d.LiveIDs(); slices.Contains(ids, victim) {
			t.Errorf("%s still live", victim)
		}
	})
}

// mintToken asks the API for a login token (POST /v1/sandboxes/{id}/ssh-token).
func (e *sshEnv) mintToken(id string, ttl float64) apitypes.SSHToken {
	e.t.Helper()
	status, body := e.postToken(id, ttl)
	var tok apitypes.SSHToken
	if err := json.Unmarshal(body, &tok); err != nil || status != 200 || !strings.HasPrefix(tok.Token, "sbt_") {
		e.t.Fatalf("mint token: %d %v %s", status, err, body)
	}
	return tok
}

func (e *sshEnv) postToken(id string, ttl float64) (int, []byte) {
	e.t.Helper()
	body, _ := json.Marshal(apitypes.SSHTokenRequest{TTLSeconds: ttl})
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", e.d.Socket)
		},
	}}
	defer c.CloseIdleConnections()
	res, err := c.Post("http://daemon/v1/sandboxes/"+id+"/ssh-token", "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res.StatusCode, b
}

func tokenAuth(tok string) ssh.AuthMethod {
	return ssh.KeyboardInteractive(func(_, _ string, qs []string, _ []bool) ([]string, error) {
		ans := make([]string, len(qs))
		for i := range qs {
			ans[i] = tok
		}
		return ans, nil
	})
}

// buildHTTPServer builds a static HTTP server for the sandbox (the shell
// image has no server of its own).
func buildHTTPServer(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "httpd")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	code := `package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "sandbox says hello to %s\n", r.URL.Path) })
	if err := http.ListenAndServe(os.Args[1], nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module httpd\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "httpd.bin")
	c := exec.Command("go", "build", "-o", bin, ".")
	c.Dir = src
	c.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("build the HTTP server: %v\n%s", err, out)
	}
	return bin
}
