package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// agentBin is the sandbox-agent binary built by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	// A prebuilt binary lets the compiled test run as a user that cannot
	// build (go test -c, then run as nobody).
	if agentBin = os.Getenv("SANDBOX_AGENT_BIN"); agentBin != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "sandbox-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "sandbox-agent")
	// cgo for the job-exec helper (pkg/agent/server/jobexec_cgo.go), which
	// links the agent statically.
	build := exec.Command("go", "build", "-tags", "netgo,osusergo", "-o", agentBin, "github.com/sandboxrunner/mcp-sandboxd/cmd/sandbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build sandbox-agent:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testAgent is a sandbox-agent running on the host for one test.
type testAgent struct {
	*agent.Client
	root   string
	socket string
	pid    int // the agent's pid as seen by the test
	logs   *bytes.Buffer
}

// startAgent runs the agent with its file root in a temporary directory,
// as the current user unless args say otherwise, and stops it (and its
// jobs) when the test ends.
func startAgent(t *testing.T, args ...string) *testAgent {
	return startAgentWrapped(t, nil, args...)
}

// startAgentWrapped runs the agent through a wrapper command line (like
// unshare) that forks it and waits for it.
func startAgentWrapped(t *testing.T, wrapper []string, args ...string) *testAgent {
	t.Helper()
	dir := t.TempDir()
	a := &testAgent{root: filepath.Join(dir, "root"), socket: filepath.Join(dir, "run", "agent.sock"), logs: &bytes.Buffer{}}
	for _, d := range []string{a.root, filepath.Dir(a.socket)} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(a.root, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := append(append(wrapper, agentBin,
		"--socket", a.socket, "--root", a.root,
		"--uid", strconv.Itoa(os.Getuid()), "--gid", strconv.Itoa(os.Getgid()),
	), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = &lockedWriter{w: a.logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.pid = cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(a.pid, syscall.SIGTERM)
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("agent exit: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			_ = syscall.Kill(a.pid, syscall.SIGKILL)
			<-waited
			t.Error("agent did not exit on SIGTERM")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.logs.String())
		}
	})
	a.Client = agent.NewClient(agent.UnixDialer(a.socket))
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := a.Ping(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if wrapper != nil {
		// The wrapper's only child is the agent.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", a.pid, a.pid))
		if err != nil {
			t.Fatal(err)
		}
		if a.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			t.Fatalf("wrapper children %q: %v", b, err)
		}
	}
	return a
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// output collects attached output per stream, checking offsets are
// contiguous.
type output struct {
	mu             sync.Mutex
	stdout, stderr bytes.Buffer
}

func (o *output) add(t *testing.T, start [2]int64) func(agent.Chunk) error {
	next := map[string]int64{agent.StreamStdout: start[0], agent.StreamStderr: start[1]}
	return func(c agent.Chunk) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if c.Offset != next[c.Stream] {
			return fmt.Errorf("%s chunk at %d, want %d", c.Stream, c.Offset, next[c.Stream])
		}
		next[c.Stream] += int64(len(c.Data))
		if c.Stream == agent.StreamStdout {
			o.stdout.Write(c.Data)
		} else {
			o.stderr.Write(c.Data)
		}
		return nil
	}
}

// run starts req and attaches until it ends.
func run(t *testing.T, c *agent.Client, req agent.ExecRequest) (stdout, stderr string, exit *agent.ExitStatus, id string) {
	t.Helper()
	ctx := testCtx(t)
	id, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("start %q: %v", req.Argv, err)
	}
	var o output
	exit, err = c.Attach(ctx, id, 0, 0, o.add(t, [2]int64{}))
	if err != nil {
		t.Fatalf("attach %q: %v", req.Argv, err)
	}
	return o.stdout.String(), o.stderr.String(), exit, id
}

func sh(script string) agent.ExecRequest {
	return agent.ExecRequest{Argv: []string{"sh", "-c", script}}
}

func TestPing(t *testing.T) {
	a := startAgent(t)
	info, err := a.Ping(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != a.pid || info.Protocol != agent.ProtocolVersion || info.Version == "" {
		t.Errorf("info = %+v, want pid %d", info, a.pid)
	}
}

func TestExecExitCode(t *testing.T) {
	a := startAgent(t)
	stdout, stderr, exit, _ := run(t, a.Client, sh("echo hi; exit 3"))
	if stdout != "hi\n" || stderr != "" {
		t.Errorf("stdout %q stderr %q", stdout, stderr)
	}
	if exit.Cause != agent.CauseExited || exit.ExitCode != 3 || exit.StdoutBytes != 3 {
		t.Errorf("exit = %+v", exit)
	}
	if exit.FinishedAt.Before(exit.StartedAt) || exit.DurationMS < 0 {
		t.Errorf("times: %+v", exit)
	}
}

func TestStderrSeparated(t *testing.T) {
	a := startAgent(t)
	stdout, stderr, exit, _ := run(t, a.Client, sh("echo out; echo err >&2; echo out2"))
	if stdout != "out\nout2\n" || stderr != "err\n" || exit.ExitCode != 0 {
		t.Errorf("stdout %q stderr %q exit %+v", stdout, stderr, exit)
	}
}

func TestStdin(t *testing.T) {
	a := startAgent(t)
	in := bytes.Repeat([]byte("line of input\n"), 10000) // more than a pipe buffer
	stdout, _, exit, _ := run(t, a.Client, agent.ExecRequest{Argv: []string{"cat"}, Stdin: in})
	if stdout != string(in) || exit.ExitCode != 0 {
		t.Errorf("cat returned %d bytes, exit %+v", len(stdout), exit)
	}
	// Without stdin the command reads /dev/null and does not hang.
	stdout, _, exit, _ = run(t, a.Client, agent.ExecRequest{Argv: []string{"cat"}})
	if stdout != "" || exit.ExitCode != 0 {
		t.Errorf("cat without stdin: %q %+v", stdout, exit)
	}
}

func TestEnvAndCwd(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	stdout, _, _, _ := run(t, a.Client, agent.ExecRequest{
		Argv: []string{"sh", "-c", `echo "$FOO|$HOME"; pwd`},
		Env:  []string{"PATH=/usr/bin:/bin", "FOO=bar baz"},
		Cwd:  dir,
	})
	if want := "bar baz|\n" + dir + "\n"; stdout != want {
		t.Errorf("got %q, want %q", stdout, want)
	}
	stdout, _, _, _ = run(t, a.Client, sh(`echo "$HOME $LANG"`))
	if stdout != "/home/sandbox C.UTF-8\n" {
		t.Errorf("default env: %q", stdout)
	}
}

func TestStartErrors(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		req  agent.ExecRequest
		code errdefs.Code
	}{
		{agent.ExecRequest{Argv: []string{"no-such-command-xyz"}}, errdefs.NotFound},
		{agent.ExecRequest{Argv: []string{"true"}, Cwd: "relative"}, errdefs.InvalidArgument},
		{agent.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.InvalidArgument},
		{agent.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, errdefs.InvalidArgument},
		{agent.ExecRequest{Argv: []string{"true"}, TTY: &agent.TTYSize{}}, errdefs.InvalidArgument},
	} {
		_, err := a.Start(ctx, tc.req)
		if agent.ErrorCode(err) != tc.code {
			t.Errorf("start %+v: err %v, want code %s", tc.req, err, tc.code)
		}
	}
}

// sessionMembers returns the live (non-zombie) processes whose session or
// process group is sid.
func sessionMembers(t *testing.T, sid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if f[0] != "Z" && (f[2] == strconv.Itoa(sid) || f[3] == strconv.Itoa(sid)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func jobPID(t *testing.T, c *agent.Client, id string) int {
	t.Helper()
	jobs, err := c.Jobs(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.ID == id {
			return j.PID
		}
	}
	t.Fatalf("job %s not listed", id)
	return 0
}

func TestTimeoutKillsWholeGroup(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	id, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & while true; do :; done"}, TimeoutMS: 500})
	if err != nil {
		t.Fatal(err)
	}
	pid := jobPID(t, a.Client, id)
	start := time.Now()
	exit, err := a.Attach(ctx, id, 0, 0, func(agent.Chunk) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if exit.Cause != agent.CauseTimeout || exit.Signal != "SIGKILL" || exit.ExitCode != 137 {
		t.Errorf("exit = %+v", exit)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %v", d)
	}
	// SIGKILL is delivered at once but a loaded machine may take a moment to
	// tear the processes down: they must be gone within 2 s.
	left := sessionMembers(t, pid)
	for deadline := time.Now().Add(2 * time.Second); len(left) != 0 && time.Now().Before(deadline); left = sessionMembers(t, pid) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) != 0 {
		t.Errorf("processes of the job survive: %v", left)
	}
}

func TestOutputLimit(t *testing.T) {
	a := startAgent(t)
	req := agent.ExecRequest{Argv: []string{"yes"}, OutputLimit: 10000}
	stdout, _, exit, _ := run(t, a.Client, req)
	if exit.Cause != agent.CauseOutputLimit || exit.StdoutBytes != 10000 || len(stdout) != 10000 {
		t.Errorf("got %d bytes, exit %+v", len(stdout), exit)
	}
}

func TestSignal(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		sig, cause, name string
		code             int
	}{
		{"SIGKILL", agent.CauseKilled, "SIGKILL", 137},
		{"TERM", agent.CauseSignal, "SIGTERM", 143},
		{"2", agent.CauseSignal, "SIGINT", 130},
	} {
		id, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Signal(ctx, id, tc.sig); err != nil {
			t.Fatalf("signal %s: %v", tc.sig, err)
		}
		exit, err := a.Attach(ctx, id, 0, 0, func(agent.Chunk) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if exit.Cause != tc.cause || exit.Signal != tc.name || exit.ExitCode != tc.code {
			t.Errorf("signal %s: exit %+v", tc.sig, exit)
		}
		if err := a.Signal(ctx, id, "KILL"); agent.ErrorCode(err) != errdefs.Conflict {
			t.Errorf("signal to finished job: %v, want conflict", err)
		}
	}
	id, _ := a.Start(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err := a.Signal(ctx, id, "SIGNOPE"); agent.ErrorCode(err) != errdefs.InvalidArgument {
		t.Errorf("unknown signal: %v", err)
	}
	if err := a.Signal(ctx, "j-0000000000000000", "KILL"); agent.ErrorCode(err) != errdefs.NotFound {
		t.Errorf("unknown job: %v", err)
	}
	if err := a.Signal(ctx, "../etc", "KILL"); agent.ErrorCode(err) != errdefs.InvalidArgument {
		t.Errorf("malformed job id: %v", err)
	}
}

func TestAttachAfterFinishAndFromOffset(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	_, _, _, id := run(t, a.Client, sh("printf abcdef; printf XYZ >&2; exit 7"))
	var o output
	exit, err := a.Attach(ctx, id, 0, 0, o.add(t, [2]int64{}))
	if err != nil {
		t.Fatal(err)
	}
	if o.stdout.String() != "abcdef" || o.stderr.String() != "XYZ" || exit.ExitCode != 7 {
		t.Errorf("full re-attach: %q %q %+v", o.stdout.String(), o.stderr.String(), exit)
	}
	var p output
	if _, err := a.Attach(ctx, id, 4, 1, p.add(t, [2]int64{4, 1})); err != nil {
		t.Fatal(err)
	}
	if p.stdout.String() != "ef" || p.stderr.String() != "YZ" {
		t.Errorf("attach from offsets: %q %q", p.stdout.String(), p.stderr.String())
	}
}

func TestAttachOlderThanRetainedTail(t *testing.T) {
	a := startAgent(t, "--retain-bytes", "4096")
	// 20000 bytes: "0000\n" .. "3999\n".
	id, err := a.Start(testCtx(t), sh(`i=0; while [ $i -lt 4000 ]; do printf '%04d\n' $i; i=$((i+1)); done`))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := a.Attach(testCtx(t), id, 1<<40, 1<<40, func(c agent.Chunk) error { return fmt.Errorf("unexpected chunk at %d", c.Offset) })
	if err != nil || exit.StdoutBytes != 20000 {
		t.Fatalf("exit %+v", exit)
	}
	var first int64 = -1
	var got bytes.Buffer
	_, err = a.Attach(testCtx(t), id, 0, 0, func(c agent.Chunk) error {
		if first < 0 {
			first = c.Offset
		}
		got.Write(c.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if first != 20000-4096 || got.Len() != 4096 || !strings.HasSuffix(got.String(), "3999\n") {
		t.Errorf("tail starts at %d with %d bytes", first, got.Len())
	}
}

func TestConcurrentAttachers(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	id, err := a.Start(ctx, sh("for i in 1 2 3 4 5; do echo $i; sleep 0.1; done"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]output, 3)
	errs := make([]error, 3)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = a.Attach(ctx, id, 0, 0, outs[i].add(t, [2]int64{}))
		}()
	}
	wg.Wait()
	for i := range outs {
		if errs[i] != nil || outs[i].stdout.String() != "1\n2\n3\n4\n5\n" {
			t.Errorf("attacher %d: %q, %v", i, outs[i].stdout.String(), errs[i])
		}
	}
}

func TestReattachWithNewClient(t *testing.T) {
	a := startAgent(t)
	id, err := a.Start(testCtx(t), sh("echo started; sleep 1; echo done; exit 4"))
	if err != nil {
		t.Fatal(err)
	}
	// A daemon that dies mid-attach: its context ends, the job goes on.
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var early output
	_, err = a.Attach(short, id, 0, 0, early.add(t, [2]int64{}))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("attach with short deadline: %v", err)
	}
	fresh := agent.NewClient(agent.UnixDialer(a.socket))
	var rest output
	off := int64(early.stdout.Len())
	exit, err := fresh.Attach(testCtx(t), id, off, 0, rest.add(t, [2]int64{off, 0}))
	if err != nil {
		t.Fatal(err)
	}
	if early.stdout.String()+rest.stdout.String() != "started\ndone\n" || exit.ExitCode != 4 {
		t.Errorf("output %q + %q, exit %+v", early.stdout.String(), rest.stdout.String(), exit)
	}
}

func TestReadPaging(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	id, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"seq", "1", "30000"}})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var off int64
	for pages := 0; ; pages++ {
		r, err := a.Read(ctx, id, off, 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if r.StdoutOffset != off || len(r.Stdout) > 4096 {
			t.Fatalf("page at %d: offset %d, %d bytes", off, r.StdoutOffset, len(r.Stdout))
		}
		got.Write(r.Stdout)
		off = r.NextStdoutOffset
		if r.State == agent.StateFinished && len(r.Stdout) == 0 {
			if r.Exit == nil || r.Exit.ExitCode != 0 || r.Exit.StdoutBytes != off {
				t.Errorf("final read: %+v", r.Exit)
			}
			break
		}
		if len(r.Stdout) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		if pages > 10000 {
			t.Fatal("paging does not end")
		}
	}
	want, _ := exec.Command("seq", "1", "30000").Output()
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("paged %d bytes, want %d", got.Len(), len(want))
	}
}

func TestJobsAndForget(t *testing.T) {
	a := startAgent(t, "--max-finished", "2")
	ctx := testCtx(t)
	var ids []string
	for range 3 {
		_, _, _, id := run(t, a.Client, agent.ExecRequest{Argv: []string{"true"}})
		ids = append(ids, id)
	}
	running, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := a.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, j := range jobs {
		states[j.ID] = j.State
	}
	// The oldest finished job was dropped to respect --max-finished.
	want := map[string]string{ids[1]: agent.StateFinished, ids[2]: agent.StateFinished, running: agent.StateRunning}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("jobs %v, want %v", states, want)
	}
	if err := a.Forget(ctx, running); agent.ErrorCode(err) != errdefs.Conflict {
		t.Errorf("forget running job: %v", err)
	}
	if err := a.Forget(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Read(ctx, ids[2], 0, 0, 0); agent.ErrorCode(err) != errdefs.NotFound {
		t.Errorf("read forgotten job: %v", err)
	}
}

// readUntil reads session output until it contains want.
func readUntil(t *testing.T, s *agent.Session, buf *bytes.Buffer, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !strings.Contains(buf.String(), want) {
		select {
		case c, ok := <-s.Output():
			if !ok {
				t.Fatalf("output ended before %q; got %q", want, buf.String())
			}
			buf.Write(c.Data)
		case <-timeout:
			t.Fatalf("no %q in %q", want, buf.String())
		}
	}
}

func TestTTYInteractive(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	id, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"sh"}, TTY: &agent.TTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := a.Interactive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var buf bytes.Buffer
	if _, err := s.Write([]byte("tty; stty size; echo mark-$((1+1))\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, &buf, "mark-2")
	if !strings.Contains(buf.String(), "/dev/pts/") || !strings.Contains(buf.String(), "24 80") {
		t.Errorf("tty output %q lacks the pts path or the size", buf.String())
	}
	if err := s.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if _, err := s.Write([]byte("stty size; exit 5\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, &buf, "30 100")
	for range s.Output() { // drain to the end
	}
	exit, err := s.Wait()
	if err != nil || exit.ExitCode != 5 {
		t.Errorf("exit %+v, %v", exit, err)
	}
}

func TestInteractiveStdinPipe(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	id, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"cat"}, OpenStdin: true, Stdin: []byte("first\n")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := a.Interactive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("second\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for c := range s.Output() {
		buf.Write(c.Data)
	}
	exit, err := s.Wait()
	if err != nil || exit.ExitCode != 0 || buf.String() != "first\nsecond\n" {
		t.Errorf("output %q exit %+v err %v", buf.String(), exit, err)
	}
	// A job without input cannot be driven interactively.
	_, _, _, done := run(t, a.Client, agent.ExecRequest{Argv: []string{"true"}})
	if _, err := a.Interactive(ctx, done); agent.ErrorCode(err) != errdefs.Conflict {
		t.Errorf("interactive on finished job: %v", err)
	}
	// An interactive job that ended before its session opened (a fast
	// command) still delivers its output and exit through the session.
	fast, err := a.Start(ctx, agent.ExecRequest{Argv: []string{"sh", "-c", "echo quick; exit 4"}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r, err := a.Read(ctx, fast, 0, 0, 0); err == nil && r.Exit != nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("fast job did not end: %+v %v", r, err)
		}
	}
	late, err := a.Interactive(ctx, fast)
	if err != nil {
		t.Fatalf("interactive on an ended interactive job: %v", err)
	}
	defer late.Close()
	buf.Reset()
	for c := range late.Output() {
		buf.Write(c.Data)
	}
	if exit, err := late.Wait(); err != nil || exit.ExitCode != 4 || buf.String() != "quick\n" {
		t.Errorf("late session: output %q exit %+v err %v", buf.String(), exit, err)
	}
}

func TestBackgroundProcessDoesNotHoldJob(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	stdout, _, exit, _ := run(t, a.Client, sh("sleep 30 & echo done"))
	if stdout != "done\n" || exit.Cause != agent.CauseExited || exit.ExitCode != 0 {
		t.Errorf("stdout %q exit %+v", stdout, exit)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("job took %v: the background sleep held it", d)
	}
}

func TestAgentTerminationKillsJobs(t *testing.T) {
	a := startAgent(t)
	id, err := a.Start(testCtx(t), agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, leftover := run(t, a.Client, sh("sleep 100 & exit 0"))
	sessions := []int{jobPID(t, a.Client, id), jobPID(t, a.Client, leftover)}
	if err := syscall.Kill(a.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, sid := range sessions {
		for len(sessionMembers(t, sid)) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("processes of session %d survive the agent's SIGTERM", sid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// t.Cleanup checks that the agent exited with status 0.
}

func TestReapsOrphansAsPID1(t *testing.T) {
	testenv.RequireRoot(t)
	a := startAgentWrapped(t, []string{"unshare", "--pid", "--fork", "--mount-proc"})
	ctx := testCtx(t)
	info, err := a.Ping(ctx)
	if err != nil || info.PID != 1 {
		t.Fatalf("agent is not PID 1: %+v, %v", info, err)
	}
	// The shells exit at once, orphaning their sleeps to PID 1.
	for range 5 {
		run(t, a.Client, sh("sleep 0.2 & exit 0"))
	}
	time.Sleep(time.Second)
	stdout, _, _, _ := run(t, a.Client, sh(`for f in /proc/[0-9]*/stat; do read -r l < "$f" && echo "${l##*) }"; done`))
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) < 2 {
		t.Fatalf("process scan too short: %q", stdout)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "Z") {
			t.Errorf("zombie left in the sandbox: %q", l)
		}
	}
}

func TestRunAsUserWithoutCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	a := startAgent(t, "--uid", "1000", "--gid", "1000")
	uid := 1000
	stdout, _, exit, _ := run(t, a.Client, agent.ExecRequest{
		Argv: []string{"sh", "-c", "id -u; id -g; id -G; grep -E '^Cap(Eff|Prm|Amb)' /proc/self/status; cat /proc/self/oom_score_adj"},
		UID:  &uid,
	})
	want := "1000\n1000\n1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\n500\n"
	if stdout != want || exit.ExitCode != 0 {
		t.Errorf("got %q, want %q (exit %+v)", stdout, want, exit)
	}
	// uid 0 only when asked for explicitly; the default is --uid.
	stdout, _, _, _ = run(t, a.Client, agent.ExecRequest{Argv: []string{"id", "-u"}})
	if stdout != "1000\n" {
		t.Errorf("default uid: %q", stdout)
	}
	root := 0
	stdout, _, _, _ = run(t, a.Client, agent.ExecRequest{Argv: []string{"id", "-u"}, UID: &root})
	if stdout != "0\n" {
		t.Errorf("explicit uid 0: %q", stdout)
	}
}

func TestFilesOwnedBySandboxUser(t *testing.T) {
	testenv.RequireRoot(t)
	a := startAgent(t, "--uid", "1000", "--gid", "1001")
	ctx := testCtx(t)
	// As in a sandbox: /workspace is the user's, / is root's. File
	// operations act as the user, who may create below the one and not in
	// the other.
	if err := os.Mkdir(filepath.Join(a.root, "workspace"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(a.root, "workspace"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/etc2/f", MkdirParents: true}, strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("creating a directory in the root-owned /: %v, want permission denied", err)
	}
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/workspace/new/dir/f.txt", MkdirParents: true}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"workspace", "workspace/new/dir", "workspace/new/dir/f.txt"} {
		fi, err := os.Stat(filepath.Join(a.root, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("%s owned by %d:%d, want 1000:1001", p, st.Uid, st.Gid)
		}
	}
}

func TestFileRoundTrip(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	content := make([]byte, 5<<20)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	fi, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/workspace/data.bin", Mode: 0o600, MkdirParents: true}, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(content)) || fi.Mode != 0o600 || fi.Type != agent.TypeFile {
		t.Errorf("write result %+v", fi)
	}
	onHost, err := os.ReadFile(filepath.Join(a.root, "workspace", "data.bin"))
	if err != nil || !bytes.Equal(onHost, content) {
		t.Fatalf("file on disk differs (%v)", err)
	}
	got, err := a.ReadFile(ctx, "/workspace/data.bin", 0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, content) || got.Truncated || got.Size != int64(len(content)) {
		t.Errorf("read back %d bytes (truncated %v), want %d", len(got.Data), got.Truncated, len(content))
	}
	part, err := a.ReadFile(ctx, "/workspace/data.bin", 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(part.Data, content[100:1100]) || !part.Truncated {
		t.Errorf("partial read wrong (truncated %v)", part.Truncated)
	}
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/workspace/data.bin", Append: true}, strings.NewReader("tail")); err != nil {
		t.Fatal(err)
	}
	st, err := a.Stat(ctx, "/workspace/data.bin")
	if err != nil || st.Size != int64(len(content))+4 || st.Mode != 0o600 {
		t.Errorf("after append: %+v, %v", st, err)
	}
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/missing/parent/f"}, strings.NewReader("x")); agent.ErrorCode(err) != errdefs.NotFound {
		t.Errorf("write without parents: %v", err)
	}
}

// TestListCap: a listing asked for max entries sends that many, the first
// in order, and counts the rest (issue 20: a directory of 100,500 entries
// was refused past the agent's cap, so REST and MCP could not list it at
// all); without max it is whole or refused, as old daemons expect.
func TestListCap(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	const n = 100_500
	big := filepath.Join(a.root, "big")
	if err := os.Mkdir(big, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f, err := os.Create(filepath.Join(big, fmt.Sprintf("f%06d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, max := range []int{1, 10_000, agent.MaxListEntries} {
		start := time.Now()
		l, err := a.ListFilesMax(ctx, "/big", false, max)
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		if len(l.Entries) != max || l.Total != n || !l.Truncated {
			t.Fatalf("max %d: %d entries, total %d, truncated %v; want %d of %d, truncated", max, len(l.Entries), l.Total, l.Truncated, max, n)
		}
		for i, e := range l.Entries {
			if want := fmt.Sprintf("/big/f%06d", i); e.Path != want || e.Type != agent.TypeFile {
				t.Fatalf("max %d: entry %d = %+v, want %s (the first in order)", max, i, e, want)
			}
		}
		t.Logf("%d of %d entries listed in %v", max, n, time.Since(start))
	}
	if _, err := a.ListFiles(ctx, "/big", false); agent.ErrorCode(err) != errdefs.LimitExceeded {
		t.Errorf("whole listing of %d entries: %v, want limit_exceeded", n, err)
	}
	f := rawRequest(t, a.socket, agent.Request{V: agent.ProtocolVersion, Op: agent.OpListFiles, Path: "/big"})
	if f.Type != agent.FrameError || f.Error.Code != errdefs.LimitExceeded {
		t.Errorf("list_files without max (a daemon before counted listings) of %d entries: %+v, want limit_exceeded before any entry", n, f)
	}
	// Hostile maxima are refused by both sides, naming the field.
	for _, max := range []int{0, -1, agent.MaxListEntries + 1} {
		if _, err := a.ListFilesMax(ctx, "/big", false, max); agent.ErrorCode(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "max:") {
			t.Errorf("client max %d: %v, want invalid_argument naming max", max, err)
		}
	}
	for _, max := range []int64{-1, agent.MaxListEntries + 1, 1 << 62} {
		f := rawRequest(t, a.socket, agent.Request{V: agent.ProtocolVersion, Op: agent.OpListFiles, Path: "/big", Max: max})
		if f.Type != agent.FrameError || f.Error.Code != errdefs.InvalidArgument || !strings.Contains(f.Error.Message, "max:") {
			t.Errorf("agent max %d: %+v, want invalid_argument naming max", max, f)
		}
	}
}

// TestListCapRecursive: wherever the cut falls in a tree (inside a
// subtree, at a directory, among names dropped from a large directory
// before the cut), the entries sent are the whole listing's first ones and
// the total is the whole listing's length.
func TestListCapRecursive(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	var paths []string
	for i := range 12 {
		paths = append(paths, fmt.Sprintf("/t/f%02d", i), fmt.Sprintf("/t/d%02d/x/y", i%5), fmt.Sprintf("/t/d%02d/z%d", i%5, i))
	}
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Join(a.root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a.root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := a.ListFiles(ctx, "/t", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole) != 12+5+5+5+12 { // f*, d*, d*/x, d*/x/y, d*/z*
		t.Fatalf("whole tree: %d entries", len(whole))
	}
	for max := 1; max <= len(whole)+1; max++ {
		l, err := a.ListFilesMax(ctx, "/t", true, max)
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		sent := min(max, len(whole))
		if len(l.Entries) != sent || l.Total != len(whole) || l.Truncated != (max < len(whole)) {
			t.Fatalf("max %d: %d entries, total %d, truncated %v; want %d of %d", max, len(l.Entries), l.Total, l.Truncated, sent, len(whole))
		}
		for i, e := range l.Entries {
			if e.Path != whole[i].Path {
				t.Fatalf("max %d: entry %d is %s, want %s", max, i, e.Path, whole[i].Path)
			}
		}
	}
	// A file lists as itself, counted.
	l, err := a.ListFilesMax(ctx, "/t/f00", true, 1)
	if err != nil || len(l.Entries) != 1 || l.Total != 1 || l.Truncated {
		t.Errorf("list of a file: %+v, %v", l, err)
	}
}

func TestListAndDelete(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, p := range []string{"/w/a.txt", "/w/sub/b.txt", "/w/sub/deep/c.txt"} {
		if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: p, MkdirParents: true}, strings.NewReader(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(a.root, "w", "link")); err != nil {
		t.Fatal(err)
	}
	entries, err := a.ListFiles(ctx, "/w", true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Path+":"+e.Type)
	}
	want := "/w/a.txt:file /w/link:symlink /w/sub:dir /w/sub/b.txt:file /w/sub/deep:dir /w/sub/deep/c.txt:file"
	if strings.Join(got, " ") != want {
		t.Errorf("list = %v\nwant  %v", got, want)
	}
	flat, err := a.ListFiles(ctx, "/w", false)
	if err != nil || len(flat) != 3 {
		t.Errorf("flat list %v, %v", flat, err)
	}
	if err := a.DeleteFile(ctx, "/w/sub", false); agent.ErrorCode(err) != errdefs.Conflict {
		t.Errorf("non-recursive delete of a full dir: %v", err)
	}
	// Deleting the symlink removes the link, not /etc inside or outside.
	if err := a.DeleteFile(ctx, "/w/link", false); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteFile(ctx, "/w/sub", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stat(ctx, "/w/sub"); agent.ErrorCode(err) != errdefs.NotFound {
		t.Errorf("stat deleted dir: %v", err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("host /etc damaged: %v", err)
	}
	for _, p := range []string{"/", "/proc/self", "/dev/null", "/sys/kernel"} {
		if err := a.DeleteFile(ctx, p, true); agent.ErrorCode(err) != errdefs.InvalidArgument {
			t.Errorf("delete %s: %v, want invalid_argument", p, err)
		}
	}
}

func TestSymlinkCannotEscapeRoot(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(a.root, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"abs": outside, "rel": "../../../../../../../../" + outside} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
		// Nothing at that path inside the root: the link dangles.
		if _, err := a.ReadFile(ctx, "/workspace/"+name, 0, 0); agent.ErrorCode(err) != errdefs.NotFound {
			t.Errorf("read through %s link: %v, want not_found", name, err)
		}
	}
	// With a decoy at the same path inside the root, the link resolves to it.
	decoy := filepath.Join(a.root, outside)
	if err := os.MkdirAll(filepath.Dir(decoy), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(decoy, []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := a.ReadFile(ctx, "/workspace/abs", 0, 0)
	if err != nil || string(got.Data) != "inside" {
		t.Fatalf("read through link: %v, %v", got, err)
	}
	// Writes never follow a final symlink, and a symlinked parent stays inside.
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/workspace/abs"}, strings.NewReader("pwned")); agent.ErrorCode(err) != errdefs.InvalidArgument {
		t.Errorf("write through link: %v", err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(ws, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteFile(ctx, agent.WriteFileRequest{Path: "/workspace/dirlink/secret"}, strings.NewReader("pwned")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Errorf("host file changed to %q", b)
	}
	if b, _ := os.ReadFile(decoy); string(b) != "pwned" {
		t.Errorf("write through dir link landed elsewhere: decoy %q", b)
	}
}

func TestPathValidation(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, p := range []string{"workspace/x", "", "/a/../b", "/a\x00b", "/a//b"} {
		if _, err := a.Stat(ctx, p); agent.ErrorCode(err) != errdefs.InvalidArgument {
			t.Errorf("client stat %q: %v", p, err)
		}
	}
	// The agent validates too, whatever the client does.
	for _, p := range []string{"etc/passwd", "/etc/../etc/passwd", "/a\x00b"} {
		f := rawRequest(t, a.socket, agent.Request{V: agent.ProtocolVersion, Op: agent.OpStat, Path: p})
		if f.Type != agent.FrameError || f.Error.Code != errdefs.InvalidArgument {
			t.Errorf("agent stat %q: %+v", p, f)
		}
	}
	f := rawRequest(t, a.socket, agent.Request{V: 99, Op: agent.OpPing})
	if f.Type != agent.FrameError || f.Error.Code != errdefs.InvalidArgument {
		t.Errorf("wrong protocol version accepted: %+v", f)
	}
}

// rawRequest sends req without the client's validation and returns the
// first frame of the answer.
func rawRequest(t *testing.T, socket string, req agent.Request) *agent.Frame {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := agent.WriteHeader(c, req); err != nil {
		t.Fatal(err)
	}
	f, err := agent.ReadFrame(bufio.NewReader(c), 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// HoldOutput keeps every byte until the first attach, however late it
// comes; without it only the retained tail is there for a late attach.
func TestHoldOutputUntilAttach(t *testing.T) {
	a := startAgent(t, "--retain-bytes", "4096")
	ctx := testCtx(t)
	prog := `echo FIRST; i=0; while [ $i -lt 4000 ]; do printf '%04d\n' $i; i=$((i+1)); done`
	for _, hold := range []bool{true, false} {
		req := sh(prog)
		req.HoldOutput = hold
		id, err := a.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the program is done (or held) by now
		var got bytes.Buffer
		exit, err := a.Attach(ctx, id, 0, 0, func(c agent.Chunk) error {
			got.Write(c.Data)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		complete := strings.HasPrefix(got.String(), "FIRST\n") && got.Len() == 20006 && exit.StdoutBytes == 20006
		if complete != hold {
			t.Errorf("hold %v: attach after 300 ms got %d bytes starting %q (exit %+v)", hold, got.Len(), got.String()[:min(10, got.Len())], exit)
		}
	}
}

// countingClient is a client of a's socket that counts its connections.
func countingClient(a *testAgent, dials *atomic.Int32) *agent.Client {
	dial := agent.UnixDialer(a.socket)
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx)
	})
}

// TestRunOneConnection: Client.Run starts a command, streams its output
// and exit on the start's own connection, and the agent forgets the job
// once the exit is delivered.
func TestRunOneConnection(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		name                string
		req                 agent.ExecRequest
		stdout, stderr      string
		stdoutLen, exitCode int
	}{
		{name: "streams and exit code", req: sh("printf out; printf err >&2; exit 3"), stdout: "out", stderr: "err", exitCode: 3},
		{name: "stdin payload", req: agent.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello")}, stdout: "hello"},
		// More than one output frame (agent.MaxChunkBytes), offsets contiguous.
		{name: "long output", req: sh("head -c 600000 /dev/zero"), stdoutLen: 600000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dials atomic.Int32
			c := countingClient(a, &dials)
			var o output
			add := o.add(t, [2]int64{})
			id, chunksBeforeStart := "", 0
			exit, err := c.Run(ctx, tc.req, func(jobID string) {
				if id != "" {
					t.Errorf("onStarted called twice (%s, %s)", id, jobID)
				}
				id = jobID
			}, func(ch agent.Chunk) error {
				if id == "" {
					chunksBeforeStart++
				}
				return add(ch)
			})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if err := agent.ValidateJobID(id); err != nil || chunksBeforeStart != 0 {
				t.Errorf("job id %q (%v), %d chunks before it", id, err, chunksBeforeStart)
			}
			if exit.Cause != agent.CauseExited || exit.ExitCode != tc.exitCode {
				t.Errorf("exit %+v, want exited %d", exit, tc.exitCode)
			}
			if tc.stdoutLen > 0 {
				if o.stdout.Len() != tc.stdoutLen || exit.StdoutBytes != int64(tc.stdoutLen) {
					t.Errorf("stdout %d bytes (exit says %d), want %d", o.stdout.Len(), exit.StdoutBytes, tc.stdoutLen)
				}
			} else if o.stdout.String() != tc.stdout || o.stderr.String() != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", o.stdout.String(), o.stderr.String(), tc.stdout, tc.stderr)
			}
			if n := dials.Load(); n != 1 {
				t.Errorf("%d connections, want 1", n)
			}
			if _, err := a.Read(ctx, id, 0, 0, 0); agent.ErrorCode(err) != errdefs.NotFound {
				t.Errorf("read of a delivered job: %v, want not_found (forgotten)", err)
			}
		})
	}

	t.Run("start error", func(t *testing.T) {
		called := false
		_, err := a.Run(ctx, agent.ExecRequest{Argv: []string{"/nonexistent/cmd"}}, func(string) { called = true }, func(agent.Chunk) error { return nil })
		if agent.ErrorCode(err) != errdefs.InvalidArgument || called {
			t.Errorf("run of a missing command: %v (started %v), want invalid_argument and no job", err, called)
		}
	})

	// Only a start follows a job: follow on any other request is refused,
	// naming the field.
	for _, op := range []string{agent.OpPing, agent.OpAttach, agent.OpJobs, agent.OpForget} {
		f := rawRequest(t, a.socket, agent.Request{V: agent.ProtocolVersion, Op: op, JobID: "j-0123456789abcdef", Follow: true})
		if f.Type != agent.FrameError || f.Error.Code != errdefs.InvalidArgument || !strings.Contains(f.Error.Message, "follow") {
			t.Errorf("%s with follow: %+v, want invalid_argument naming follow", op, f)
		}
	}
}

// TestRunClientGoneKeepsJob: a client that goes away before the exit is
// sent leaves the job in the agent, to be attached to later, as after an
// attach that went away.
func TestRunClientGoneKeepsJob(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	id := ""
	// The command waits for a file the test writes after the client has
	// gone, so it cannot end before.
	gate := filepath.Join(a.root, "gate")
	_, err := a.Run(ctx, sh("while [ ! -e "+gate+" ]; do sleep 0.01; done; echo done"), func(jobID string) {
		id = jobID
		cancel()
	}, func(agent.Chunk) error { return nil })
	if err == nil || id == "" {
		t.Fatalf("run cancelled after the start: %v (job %q), want an error and a job", err, id)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var o output
	exit, err := a.Attach(testCtx(t), id, 0, 0, o.add(t, [2]int64{}))
	if err != nil {
		t.Fatalf("attach after the client went: %v", err)
	}
	if exit.ExitCode != 0 || o.stdout.String() != "done\n" {
		t.Errorf("exit %+v stdout %q, want 0 and the whole output", exit, o.stdout.String())
	}
}
