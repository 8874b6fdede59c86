package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/ledger"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// A fake backend: no process, no root. Its handles run no agent of ours
// (Agentless, ready at once) and serve commands and files from memory
// through sandbox.GuestOps, so the Manager's state machine, capability
// checks, routing, ledger release and reaper run as they do for a VM of
// an administrator's disk.

const fakeKind = "fake"

type fakeBackend struct {
	caps sandbox.Capabilities

	mu       sync.Mutex
	handles  map[string]*fakeHandle
	started  []string
	released []string
	// releaseGate, if not nil, holds every release until it is closed.
	releaseGate chan struct{}
}

func (b *fakeBackend) Name() string                       { return "fake" }
func (b *fakeBackend) Capabilities() sandbox.Capabilities { return b.caps }

func (b *fakeBackend) Start(ctx context.Context, req sandbox.StartRequest, rec ledger.Recorder) (sandbox.Handle, error) {
	if err := rec.Record(ctx, ledger.Resource{Kind: fakeKind, Key: req.ID}); err != nil {
		return nil, err
	}
	h := &fakeHandle{caps: b.caps, done: make(chan struct{}), files: map[string][]byte{}}
	b.mu.Lock()
	b.handles[req.ID] = h
	b.started = append(b.started, req.ID)
	b.mu.Unlock()
	return h, nil
}

func (b *fakeBackend) Adopt(context.Context, sandbox.AdoptRequest) (sandbox.Handle, error) {
	return nil, errors.New("the fake backend adopts nothing")
}

func (b *fakeBackend) Scan(context.Context) (map[string][]ledger.Resource, error) { return nil, nil }

// release is the releaser of fakeKind: the fake machine stops.
func (b *fakeBackend) release(_ context.Context, r ledger.Resource) error {
	b.mu.Lock()
	gate := b.releaseGate
	b.mu.Unlock()
	if gate != nil {
		<-gate
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.handles[r.Key]; h != nil {
		close(h.done)
		delete(b.handles, r.Key)
	}
	b.released = append(b.released, r.Key)
	return nil
}

type fakeHandle struct {
	caps sandbox.Capabilities
	done chan struct{}

	mu    sync.Mutex
	files map[string][]byte
	execs []sandbox.ExecSpec
}

func (h *fakeHandle) Capabilities() sandbox.Capabilities { return h.caps }
func (h *fakeHandle) Done() <-chan struct{}              { return h.done }
func (h *fakeHandle) ExitDescription() string            { return "" }
func (h *fakeHandle) Dial(context.Context) (net.Conn, error) {
	return nil, errors.New("the fake handle has no agent to dial")
}
func (h *fakeHandle) Identity() sandbox.Identity { return sandbox.Identity{PID: 1} }
func (h *fakeHandle) CgroupPath() string         { return "" }
func (h *fakeHandle) Usage(context.Context) (*sandbox.Usage, error) {
	return &sandbox.Usage{}, nil
}
func (h *fakeHandle) OOMKills() (uint64, error)           { return 0, nil }
func (h *fakeHandle) NoAgent() string                     { return "the fake guest runs only a fake guest agent" }
func (h *fakeHandle) WaitReady(ctx context.Context) error { return nil }

// GuestExec answers the command and the environment it got.
func (h *fakeHandle) GuestExec(_ context.Context, spec sandbox.ExecSpec, env []string, limit int64) (*sandbox.ExecResult, error) {
	h.mu.Lock()
	h.execs = append(h.execs, spec)
	h.mu.Unlock()
	out := spec.Command + "|" + strings.Join(env, ",")
	if limit > 0 && int64(len(out)) > limit {
		out = out[:limit]
	}
	code := 0
	return &sandbox.ExecResult{Stdout: out, Termination: sandbox.Termination{Cause: sandbox.CauseExited, ExitCode: &code}}, nil
}

func (h *fakeHandle) GuestWriteFile(_ context.Context, path string, _ uint32, data []byte) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.files[path] = bytes.Clone(data)
	return int64(len(data)), nil
}

func (h *fakeHandle) GuestReadFile(_ context.Context, path string, offset, max int64) (*agent.FileData, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.files[path]
	if !ok {
		return nil, errdefs.NotFoundf("path: no %s in the fake guest", path)
	}
	end := min(int64(len(b)), offset+max)
	return &agent.FileData{Path: path, Data: b[offset:end], Size: int64(len(b)), Truncated: end < int64(len(b))}, nil
}

func (h *fakeHandle) GuestCheckPath(field, path string) error {
	if !strings.HasPrefix(path, "/") {
		return errdefs.Invalidf("%s: %q is not absolute", field, path)
	}
	return nil
}

func (h *fakeHandle) Screenshot(context.Context) ([]byte, error) { return []byte("\x89PNG fake"), nil }

// newFakeManager is a Manager over a fake backend with caps, on a store in
// a temporary directory.
func newFakeManager(t *testing.T, caps sandbox.Capabilities, tweak func(*sandbox.Options)) (*sandbox.Manager, *fakeBackend) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	imgs, err := image.OpenStore(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBackend{caps: caps, handles: map[string]*fakeHandle{}}
	l := ledger.New(st)
	l.Register(fakeKind, b.release)
	opt := sandbox.Options{Store: st, Images: imgs, Backend: b, Ledger: l, ReapInterval: 10 * time.Millisecond, OutputLimit: 1 << 20}
	if tweak != nil {
		tweak(&opt)
	}
	m, err := sandbox.NewManager(opt)
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	t.Cleanup(m.Close)
	return m, b
}

// fakeSpec is a sandbox that is not made from the image store (as a VM of
// an administrator's disk is not).
func fakeSpec() sandbox.Spec {
	return sandbox.Spec{Language: "fake", Image: "fake-disk", BootDisk: "fake-disk", Env: map[string]string{"SB": "1"}}
}

// TestFakeBackendCapabilities: on a sandbox whose handle can do only exec,
// files and screenshots through a guest agent, those work — routed to the
// handle, counted as commands (running, then ready again) — and every
// other operation is refused at once with unavailable, naming the sandbox,
// the missing capability and why; terminate releases through the ledger.
func TestFakeBackendCapabilities(t *testing.T) {
	m, b := newFakeManager(t, sandbox.Capabilities{GuestAgent: true, Screenshot: true}, nil)
	ctx := context.Background()
	info, err := m.Create(ctx, fakeSpec())
	if err != nil {
		t.Fatal(err)
	}
	if info.State != sandbox.StateReady || !slices.Equal(info.Capabilities, []string{"exec", "files", "screenshot"}) {
		t.Fatalf("created: %+v", info)
	}
	if caps, err := m.Capabilities(ctx, info.ID); err != nil || caps.Agent || !caps.Has(sandbox.CapExec) || caps.Has(sandbox.CapJobs) {
		t.Errorf("capabilities: %+v %v", caps, err)
	}

	res, err := m.Exec(ctx, info.ID, sandbox.ExecSpec{Command: "echo hi", Argv: []string{"/bin/sh", "-c", "echo hi"}, Env: map[string]string{"REQ": "2"}}, nil)
	if err != nil || res.Stdout != "echo hi|REQ=2,SB=1" {
		t.Errorf("exec through the guest agent: %+v %v", res, err)
	}
	if got, err := m.Get(ctx, info.ID); err != nil || got.State != sandbox.StateReady {
		t.Errorf("after the command: %+v %v", got, err)
	}
	if _, err := m.WriteFile(ctx, info.ID, agent.WriteFileRequest{Path: "/x/a.txt", Size: 5}, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if d, err := m.ReadFile(ctx, info.ID, "/x/a.txt", 1, 3); err != nil || string(d.Data) != "ell" || d.Size != 5 || !d.Truncated {
		t.Errorf("read back: %+v %v", d, err)
	}
	if _, err := m.WriteFile(ctx, info.ID, agent.WriteFileRequest{Path: "/x/a.txt", Size: 5}, strings.NewReader("hey")); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "content:") {
		t.Errorf("a short upload: %v", err)
	}
	if ok, err := m.GuestCheckPath(ctx, info.ID, "path", "rel"); !ok || !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "path:") {
		t.Errorf("a guest path check: %v %v", ok, err)
	}
	if png, err := m.Screenshot(ctx, info.ID); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("screenshot: %q %v", png, err)
	}

	refusals := map[string]struct {
		call func() error
		cap  string
	}{
		"job":  {func() error { _, err := m.StartJob(ctx, info.ID, sandbox.ExecSpec{Argv: []string{"true"}}); return err }, "jobs"},
		"jobs": {func() error { _, err := m.Jobs(ctx, info.ID); return err }, "jobs"},
		"terminal": {func() error {
			_, err := m.OpenTerminal(ctx, info.ID, sandbox.TerminalSpec{Argv: []string{"sh"}})
			return err
		}, "pty"},
		"list":     {func() error { _, err := m.ListFiles(ctx, info.ID, "/x", false); return err }, "file_list"},
		"list max": {func() error { _, err := m.ListFilesMax(ctx, info.ID, "/x", false, 10); return err }, "file_list"},
		"delete":   {func() error { return m.DeleteFile(ctx, info.ID, "/x/a.txt", false) }, "file_list"},
		"port":     {func() error { _, err := m.DialPort(ctx, info.ID, 80); return err }, "ports"},
		"pause":    {func() error { _, err := m.Pause(ctx, info.ID); return err }, "pause"},
		"snapshot": {func() error { return m.Frozen(ctx, info.ID, func(sandbox.WritableDirs) error { return nil }) }, "file_snapshot"},
		"machine":  {func() error { return m.SaveMachineSnapshot(ctx, info.ID, "s") }, "memory_snapshot"},
		"require":  {func() error { return m.Require(ctx, info.ID, sandbox.CapPorts) }, "ports"},
	}
	for name, r := range refusals {
		err := r.call()
		msg := errdefs.MessageOf(err)
		if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(msg, "sandbox "+info.ID) || !strings.Contains(msg, "lacks the "+r.cap+" capability") ||
			!strings.Contains(msg, "the fake guest runs only a fake guest agent") {
			t.Errorf("%s: got %v, want unavailable naming %s and the %s capability", name, err, info.ID, r.cap)
		}
	}
	if _, err := m.WriteFile(ctx, info.ID, agent.WriteFileRequest{Path: "/x/a.txt", Size: 1, Append: true}, strings.NewReader("x")); !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "append:") {
		t.Errorf("append through the guest agent: %v", err)
	}

	if out, err := m.Terminate(ctx, info.ID, ""); err != nil || out.State != sandbox.StateTerminated || len(out.Capabilities) != 0 {
		t.Fatalf("terminate: %+v %v", out, err)
	}
	b.mu.Lock()
	released := slices.Clone(b.released)
	b.mu.Unlock()
	if !slices.Equal(released, []string{info.ID}) {
		t.Errorf("released through the ledger: %v", released)
	}
	if _, err := m.Exec(ctx, info.ID, sandbox.ExecSpec{Command: "true"}, nil); !errdefs.Is(err, errdefs.Conflict) || !strings.Contains(err.Error(), "sandbox "+info.ID+" is terminated") {
		t.Errorf("exec after terminate: %v", err)
	}
	if _, err := m.Capabilities(ctx, info.ID); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("capabilities after terminate: %v", err)
	}
}

// TestFakeBackendReaper: the reaper terminates an idle sandbox of any
// backend (the idle timeout counts from its last command), and its
// machine is released through the ledger.
func TestFakeBackendReaper(t *testing.T) {
	m, b := newFakeManager(t, sandbox.Capabilities{GuestAgent: true}, func(o *sandbox.Options) { o.IdleTimeout = 100 * time.Millisecond })
	ctx := context.Background()
	info, err := m.Create(ctx, fakeSpec())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := m.Get(ctx, info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateTerminated {
			if !strings.Contains(got.Reason, "idle for") {
				t.Errorf("reaped for %q", got.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reaped: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.handles) != 0 || !slices.Equal(b.released, []string{info.ID}) {
		t.Errorf("after the reaper: live %v, released %v", b.handles, b.released)
	}
}

// waitFor polls cond every reap interval until it holds, failing the test
// after a bounded wait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warmSandboxes lists the unclaimed warm sandboxes.
func warmSandboxes(t *testing.T, m *sandbox.Manager) []*sandbox.Info {
	t.Helper()
	all, err := m.List(context.Background(), sandbox.StateReady)
	if err != nil {
		t.Fatal(err)
	}
	var out []*sandbox.Info
	for _, in := range all {
		if in.Labels[sandbox.PoolLabel] == "warm" {
			out = append(out, in)
		}
	}
	return out
}

// TestFakeBackendPool: the warm pool starts its sandbox, is never reaped for
// idleness while warm, hands it to a matching create (which gets the
// request's labels, and starts nothing), refills in the background, and
// leaves a create that does not match (other limits) to a fresh start. The
// claimed sandbox is then an ordinary one, reaped when idle.
func TestFakeBackendPool(t *testing.T) {
	const idle = 150 * time.Millisecond
	m, b := newFakeManager(t, sandbox.Capabilities{GuestAgent: true}, func(o *sandbox.Options) {
		o.IdleTimeout = idle
		o.Pool = map[string]int{"fake-disk": 1}
		o.PoolSpec = func(image string) (sandbox.Spec, error) {
			if image != "fake-disk" {
				return sandbox.Spec{}, errors.New("no such image")
			}
			return fakeSpec(), nil
		}
	})
	ctx := context.Background()
	starts := func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.started) }

	waitFor(t, "a warm sandbox", func() bool { return len(warmSandboxes(t, m)) == 1 })
	warm := warmSandboxes(t, m)[0]
	// Warm sandboxes outlive the idle timeout: nobody is waiting on them.
	for time.Since(warm.CreatedAt) < 3*idle {
		if got, err := m.Get(ctx, warm.ID); err != nil || got.State != sandbox.StateReady {
			t.Fatalf("a warm sandbox was reaped: %+v %v", got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := starts(); n != 1 {
		t.Fatalf("%d starts for a pool of one", n)
	}

	spec := fakeSpec()
	spec.Labels = map[string]string{"owner": "test"}
	info, err := m.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != warm.ID || info.Labels["owner"] != "test" || info.Labels[sandbox.PoolLabel] != "" || info.State != sandbox.StateReady {
		t.Fatalf("claimed %+v, want the warm sandbox %s with the request's labels", info, warm.ID)
	}
	waitFor(t, "the pool to refill", func() bool {
		w := warmSandboxes(t, m)
		return len(w) == 1 && w[0].ID != warm.ID
	})
	if n := starts(); n != 2 {
		t.Fatalf("%d starts after one claim and one refill, want 2", n)
	}

	other := fakeSpec()
	other.Limits.MemoryBytes = 1 << 30
	fresh, err := m.Create(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == warm.ID || len(warmSandboxes(t, m)) != 1 || starts() != 3 {
		t.Fatalf("a non-matching create: %+v (starts %d, warm %d)", fresh, starts(), len(warmSandboxes(t, m)))
	}

	waitFor(t, "the claimed sandbox to be reaped", func() bool {
		got, err := m.Get(ctx, info.ID)
		return err == nil && got.State == sandbox.StateTerminated && strings.Contains(got.Reason, "idle for")
	})
}

// TestFakeBackendPoolRefillAfterClaimer: a claim holds its pool's refill
// (which would compete for the CPUs with the claimer's request) for
// PoolRefillDelay even though the pool's loop ticks every 10 ms here; the
// claimed sandbox's end lifts the hold at once.
func TestFakeBackendPoolRefillAfterClaimer(t *testing.T) {
	m, b := newFakeManager(t, sandbox.Capabilities{GuestAgent: true}, func(o *sandbox.Options) {
		o.Pool = map[string]int{"fake-disk": 1}
		o.PoolSpec = func(string) (sandbox.Spec, error) { return fakeSpec(), nil }
	})
	ctx := context.Background()
	starts := func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.started) }
	waitFor(t, "a warm sandbox", func() bool { return len(warmSandboxes(t, m)) == 1 })

	claimedAt := time.Now()
	info, err := m.Create(ctx, fakeSpec())
	if err != nil {
		t.Fatal(err)
	}
	if info.Labels[sandbox.PoolLabel] != "" || starts() != 1 {
		t.Fatalf("create did not claim the warm sandbox: %+v, %d starts", info, starts())
	}
	// Several of the loop's ticks pass; the refill waits.
	for time.Since(claimedAt) < sandbox.PoolRefillDelay/2 {
		n := starts()
		if time.Since(claimedAt) >= sandbox.PoolRefillDelay {
			break // this goroutine was held up: the hold may be over
		}
		if n != 1 {
			t.Fatalf("the pool refilled %v after a claim, within its hold of %v", time.Since(claimedAt), sandbox.PoolRefillDelay)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The claimed sandbox ends: the refill starts now, not at the hold's end.
	if _, err := m.Terminate(ctx, info.ID, "done"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refill", func() bool { return len(warmSandboxes(t, m)) == 1 && starts() == 2 })

	// Without a terminate, the hold ends by itself.
	again, err := m.Create(ctx, fakeSpec())
	if err != nil || again.Labels[sandbox.PoolLabel] != "" || starts() != 2 {
		t.Fatalf("second claim: %+v %v (%d starts)", again, err, starts())
	}
	waitFor(t, "the refill after the hold", func() bool { return len(warmSandboxes(t, m)) == 1 && starts() == 3 })
}

// TestFakeBackendMaxSandboxesWaitsForTerminating: at max_sandboxes, a
// create that only a sandbox being terminated keeps out waits for it to go
// and succeeds; one kept out by a live sandbox is refused at once, naming
// max_sandboxes.
func TestFakeBackendMaxSandboxesWaitsForTerminating(t *testing.T) {
	m, b := newFakeManager(t, sandbox.Capabilities{GuestAgent: true}, func(o *sandbox.Options) { o.MaxSandboxes = 1 })
	ctx := context.Background()
	first, err := m.Create(ctx, fakeSpec())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := m.Create(ctx, fakeSpec()); errdefs.CodeOf(err) != errdefs.LimitExceeded || !strings.Contains(err.Error(), "max_sandboxes") {
		t.Fatalf("create beside a live sandbox at max_sandboxes 1: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the refusal took %v: it waited though nothing was ending", d)
	}

	gate := make(chan struct{})
	b.mu.Lock()
	b.releaseGate = gate
	b.mu.Unlock()
	terminated := make(chan error, 1)
	go func() { _, err := m.Terminate(ctx, first.ID, "done"); terminated <- err }()
	// The record says terminated before the release, which the gate holds.
	waitFor(t, "the first sandbox to be terminating", func() bool {
		got, err := m.Get(ctx, first.ID)
		return err == nil && got.State == sandbox.StateTerminated
	})
	created := make(chan error, 1)
	go func() { _, err := m.Create(ctx, fakeSpec()); created <- err }()
	select {
	case err := <-created:
		t.Fatalf("create returned (%v) while the sandbox it must wait for was still being released", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-terminated; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-created:
		if err != nil {
			t.Fatalf("create after the terminating sandbox went: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("create still waiting after the terminating sandbox went")
	}
}
