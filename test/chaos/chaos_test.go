//go:build chaos

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

const (
	numWorkers = 8
	// maxOwned bounds each client's live sandboxes: 8 × 3, plus run_code's
	// own and the VM, stay under sandbox.max_sandboxes (32).
	maxOwned = 3
	// readyLimit is how soon after its start a restarted daemon must
	// answer /readyz with "ready".
	readyLimit = 2 * time.Second
	// survivorGrace is how long processes of a killed daemon may take to
	// go (parent-death signals are delivered asynchronously).
	survivorGrace = 2 * time.Second
	// returnLimit is how soon after a kill the operations in flight must
	// have returned (their connections reset).
	returnLimit = 3 * time.Second
	reqLabel    = "chaos-req"
	// runLabel marks run_code's own sandbox (pkg/engine StartRun).
	runLabel    = "sandboxd.run"
	previewPort = 8000
)

// Client-side time limits of each operation: generous for two loaded
// cores, so that a client reaching one means the daemon (or a process of
// a killed one) left it hanging.
var timeouts = map[string]time.Duration{
	"create": 90 * time.Second, "exec": 30 * time.Second, "write": 30 * time.Second,
	"snapshot": 60 * time.Second, "restore": 60 * time.Second, "run_code": 90 * time.Second,
	"expose": 30 * time.Second, "terminate": 60 * time.Second, "vm_create": 5 * time.Minute,
	"vm_exec": 60 * time.Second,
}

// sbx is a client's model of one of its sandboxes: what the daemon
// acknowledged.
type sbx struct {
	id      string
	flavour string // plain, network, root, snapshot, python, vm
	files   map[string]string
	fresh   []string // files acknowledged since the last check
	// uncertain: an unacknowledged restore or terminate ran on it, so its
	// files and even its state are unknown.
	uncertain bool
	port      *client.PortExposure // acknowledged exposure of a job's server
	portFresh bool
	snaps     []snapModel // acknowledged snapshots of it
	from      string      // origin of the snapshot it was forked from
	restored  []string    // origins of the snapshots restored into it
}

// origin says where a sandbox's files come from, for messages.
func (s *sbx) origin() string {
	o := s.flavour
	if s.from != "" {
		o += "<" + s.from
	}
	for _, r := range s.restored {
		o += " restored<" + r
	}
	return o
}

type snapModel struct {
	id        string
	origin    string // flavours of the sandboxes it descends from
	files     map[string]string
	uncertain bool
}

// pendingCreate is a create that got no answer: it carries a label, so
// that after the restart the sandbox (if the daemon got that far) is found.
type pendingCreate struct {
	req     string
	flavour string
	snap    *snapModel
}

type ackedRun struct{ id, token string }

type opCount struct {
	Acked  int            `json:"acked"`
	Failed int            `json:"failed"`
	Codes  map[string]int `json:"failure_codes,omitempty"`
}

// worker is one of the eight clients. Its fields are touched by its own
// goroutine while an epoch runs and by the orchestrator between epochs.
type worker struct {
	n        int
	rng      *rand.Rand
	o        *orchestrator
	c        *client.Client
	mcp      *mcpclient.Client
	owned    []*sbx
	pending  []pendingCreate
	snaps    []snapModel // acknowledged snapshots (for forks)
	newSnaps []string    // acknowledged since the last check
	termed   []string    // acknowledged terminates since the last check
	runs     []ackedRun  // acknowledged run_code since the last check
	seq      int
	ops      map[string]*opCount
	problems []string // acknowledged answers that were wrong, client timeouts
	// maxAfterKill is the longest an operation in flight at a kill took
	// to return after it.
	maxAfterKill  time.Duration
	lastAfterKill time.Duration // the same, in this epoch
	timeouts      int           // operations that reached their time limit
	vmCreate      bool          // create the VM in this epoch
}

// orchestrator runs the epochs: start, check, load, kill.
type orchestrator struct {
	t        *testing.T
	r        *rig
	seed     uint64
	rng      *rand.Rand // the kills' moments
	checkRng *rand.Rand // which older files and ports a check looks at
	workers  []*worker
	stop     atomic.Bool
	killedAt atomic.Int64 // unix nanoseconds of the last kill
	checked  map[string]bool
	vmDone   chan error
	rep      report
}

// verified counts what the checks after the restarts looked at.
type verified struct {
	Sandboxes   int `json:"acknowledged_sandboxes_live"`
	Files       int `json:"files_read_back"`
	Ports       int `json:"ports_served"`
	Snapshots   int `json:"snapshots"`
	Runs        int `json:"run_records"`
	Terminated  int `json:"terminates"`
	PendingSeen int `json:"unanswered_creates_found"`
	PendingLive int `json:"unanswered_creates_live"`
	Released    int `json:"failed_or_terminated_released"`
}

type report struct {
	Seed               uint64              `json:"seed"`
	Kills              int                 `json:"kills"`
	Clients            int                 `json:"clients"`
	Ops                map[string]*opCount `json:"ops"`
	Acked              int                 `json:"acked"`
	Failed             int                 `json:"failed"`
	RestartToReadyP50  string              `json:"restart_to_ready_p50"`
	RestartToReadyP99  string              `json:"restart_to_ready_p99"`
	RestartToReadyMax  string              `json:"restart_to_ready_max"`
	SlowStarts         int                 `json:"starts_over_2s"`
	ReturnAfterKillMax string              `json:"return_after_kill_max"`
	HalfMadeFailed     int                 `json:"half_made_failed_released"`
	AckedThenFailed    int                 `json:"acknowledged_then_failed"`
	OrphanRunSandboxes int                 `json:"orphaned_run_sandboxes"`
	Survivors          []string            `json:"survivors"`
	ClientTimeouts     int                 `json:"client_timeouts"`
	Problems           int                 `json:"problems"`
	Verified           verified            `json:"verified"`
	Leftovers          []string            `json:"leftovers"`
	VM                 string              `json:"vm"`
	Duration           string              `json:"duration"`
	readies            []time.Duration
}

// TestChaos: see the package documentation. CHAOS_KILLS (default 50) sets
// the number of kills, CHAOS_SEED replays a run's random choices (the
// moments of the kills and each client's operations; what the daemon got
// done before each kill still depends on timing), CHAOS_REPORT names a
// file for the figures as JSON.
func TestChaos(t *testing.T) {
	testenv.RequireRoot(t)
	kills := 50
	if s := os.Getenv("CHAOS_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CHAOS_KILLS=%q: want a positive count", s)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", s)
		}
		seed = n
	}
	t.Logf("CHAOS_SEED=%d CHAOS_KILLS=%d (CHAOS_SEED replays the choices)", seed, kills)
	fmt.Fprintf(os.Stderr, "chaos: CHAOS_SEED=%d CHAOS_KILLS=%d\n", seed, kills)

	// The VM guest (vm-linux) into the shared cache before the daemon
	// needs it; the daemon makes its fast-start template on the first
	// create.
	vmenv.Guest(t)
	r := newRig(t, 1, "python")
	o := &orchestrator{t: t, r: r, seed: seed, rng: rand.New(rand.NewPCG(seed, 1<<20)),
		checkRng: rand.New(rand.NewPCG(seed, 1<<21)), checked: map[string]bool{},
		vmDone: make(chan error, 1)}
	o.rep = report{Seed: seed, Clients: numWorkers, Ops: map[string]*opCount{}}
	for n := range numWorkers {
		o.workers = append(o.workers, &worker{n: n, rng: rand.New(rand.NewPCG(seed, uint64(n))), o: o, ops: map[string]*opCount{}})
	}
	began := time.Now()
	t.Cleanup(func() { o.finish(began) })

	// The VM is created by client 0 in one epoch, which lasts until the
	// create answers; the kill then comes at a random moment after.
	vmEpoch := min(1+o.rng.IntN(max(1, kills/4)), kills-1)
	for epoch := 0; epoch <= kills; epoch++ {
		o.startAndCheck(epoch)
		if epoch == kills {
			break
		}
		o.workers[0].vmCreate = epoch == vmEpoch
		delay := 150*time.Millisecond + time.Duration(o.rng.Int64N(int64(4*time.Second)))
		o.runEpoch(epoch, delay, epoch == vmEpoch)
	}
	if !strings.HasPrefix(o.rep.VM, "created ") {
		t.Errorf("the run's VM was not created (%q)", o.rep.VM)
	}
	o.endAll()
}

// startAndCheck starts the daemon, times its readiness and, after a kill,
// checks the state against what the clients were told.
func (o *orchestrator) startAndCheck(epoch int) {
	t := o.t
	ready, err := o.r.start(10 * time.Second)
	if err != nil {
		t.Fatalf("start %d: %v\n%s", epoch, err, o.r.d.Log())
	}
	o.rep.readies = append(o.rep.readies, ready)
	if ready > readyLimit {
		o.rep.SlowStarts++
		t.Errorf("start %d: /readyz ready %v after the daemon's start, want within %v", epoch, ready.Round(time.Millisecond), readyLimit)
	}
	if epoch > 0 {
		o.verify(epoch)
	}
}

// runEpoch lets the clients loose, kills the daemon after delay (after
// the VM create answered, in the VM's epoch), waits for every client to
// return and looks for processes of the killed daemon.
func (o *orchestrator) runEpoch(epoch int, delay time.Duration, vm bool) {
	t := o.t
	o.stop.Store(false)
	var wg sync.WaitGroup
	for _, w := range o.workers {
		w.c = o.r.client()
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run()
		}()
	}
	if vm {
		select {
		case err := <-o.vmDone:
			if err != nil {
				t.Errorf("vm create (epoch %d): %v", epoch, err)
				o.rep.VM = "create failed: " + err.Error()
			}
		case <-time.After(timeouts["vm_create"] + 10*time.Second):
			t.Errorf("vm create (epoch %d) did not return", epoch)
		}
		delay = 200*time.Millisecond + time.Duration(o.rng.Int64N(int64(3*time.Second)))
	}
	time.Sleep(delay)
	pid := o.r.d.PID()
	killed := time.Now()
	o.killedAt.Store(killed.UnixNano())
	o.stop.Store(true)
	o.r.d.Crash()
	o.r.pid = 0
	o.rep.Kills++
	// Processes of the killed daemon are looked for while the clients are
	// still waiting: a survivor holding the daemon's descriptors (its
	// listeners, the server side of the clients' connections) leaves them
	// hanging until it is gone. Found, reported and ended, so that the run
	// goes on and says how often it happened.
	if ss := o.r.waitSurvivors(survivorGrace); len(ss) != 0 {
		for _, s := range ss {
			o.rep.Survivors = append(o.rep.Survivors, fmt.Sprintf("kill %d of daemon pid %d: %s", epoch+1, pid, s))
		}
		t.Errorf("kill %d (daemon pid %d): %d process(es) of the killed daemon outlived it by %v: %v", epoch+1, pid, len(ss), survivorGrace, ss)
		killSurvivors(ss)
		o.r.waitSurvivors(survivorGrace)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeouts["vm_create"] + 30*time.Second):
		t.Fatalf("epoch %d: clients still busy long after the kill and their timeouts", epoch)
	}
	for _, w := range o.workers {
		w.c.Close()
		w.c = nil
		if w.mcp != nil {
			w.mcp.Close()
			w.mcp = nil
		}
		// An operation in flight at the kill fails at once (its connection
		// is reset) unless something of the dead daemon holds it open.
		if w.lastAfterKill > returnLimit {
			w.problems = append(w.problems, fmt.Sprintf("an operation in flight at the kill returned %v after it (want within %v): the client was left hanging", w.lastAfterKill.Round(time.Millisecond), returnLimit))
		}
		w.lastAfterKill = 0
		for _, p := range w.problems {
			t.Errorf("epoch %d client %d: %s", epoch, w.n, p)
		}
		o.rep.Problems += len(w.problems)
		w.problems = nil
	}
}

// run is one client's epoch: operations until the kill.
func (w *worker) run() {
	if w.vmCreate {
		w.vmCreate = false
		w.o.vmDone <- w.createVM()
	}
	for !w.o.stop.Load() {
		w.step()
	}
}

// do runs one operation with its time limit and counts its outcome. An
// operation that reaches its own time limit is a client left hanging.
func (w *worker) do(kind string, fn func(ctx context.Context) error) error {
	limit := timeouts[kind]
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	t0 := time.Now()
	err := fn(ctx)
	end := time.Now()
	oc := w.ops[kind]
	if oc == nil {
		oc = &opCount{Codes: map[string]int{}}
		w.ops[kind] = oc
	}
	if err == nil {
		oc.Acked++
		return nil
	}
	oc.Failed++
	code := string(errdefs.CodeOf(err))
	if w.o.stop.Load() {
		code = "daemon killed"
		if k := time.Unix(0, w.o.killedAt.Load()); end.After(k) {
			w.maxAfterKill = max(w.maxAfterKill, end.Sub(k))
			w.lastAfterKill = max(w.lastAfterKill, end.Sub(k))
		}
	}
	oc.Codes[code]++
	if oc.Codes[code] <= 3 && code != "daemon killed" && kind != "write" {
		w.o.t.Logf("client %d: %s failed with the daemon up: %v", w.n, kind, err)
	}
	if isTimeout(err) || end.Sub(t0) > limit+2*time.Second {
		w.timeouts++
		w.problems = append(w.problems, fmt.Sprintf("%s waited %v (its time limit %v): %v", kind, end.Sub(t0).Round(time.Millisecond), limit, err))
	}
	return err
}

func (w *worker) token() string {
	w.seq++
	return fmt.Sprintf("c%d-%d-%08x", w.n, w.seq, w.rng.Uint32())
}

// step picks and runs one operation.
func (w *worker) step() {
	var live []*sbx
	for _, s := range w.owned {
		if s.flavour != "vm" {
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		w.create()
		return
	}
	s := live[w.rng.IntN(len(live))]
	switch p := w.rng.IntN(100); {
	case p < 14:
		if len(w.owned) < maxOwned {
			w.create()
		} else {
			w.exec(s)
		}
	case p < 32:
		if vm := w.vm(); vm != nil && p < 18 {
			w.exec(vm)
		} else {
			w.exec(s)
		}
	case p < 50:
		w.write(s)
	case p < 58:
		if s.flavour == "python" {
			w.write(s)
		} else {
			w.snapshot(s)
		}
	case p < 64:
		if s.flavour == "python" || len(s.snaps) == 0 {
			w.exec(s)
		} else {
			w.restore(s, s.snaps[w.rng.IntN(len(s.snaps))])
		}
	case p < 71:
		w.runCode()
	case p < 78:
		w.expose()
	case p < 90:
		w.terminate(s)
	default:
		w.exec(s)
	}
}

func (w *worker) vm() *sbx {
	for _, s := range w.owned {
		if s.flavour == "vm" {
			return s
		}
	}
	return nil
}

var flavours = []string{"plain", "network", "root", "snapshot", "python"}

// create makes a sandbox of a random flavour: without or with network
// (egress), root mode, a fork of one of the client's snapshots, or a
// python one (for run_code and a port's server). It carries a label and
// a request id, so that an unanswered create is found after the restart.
func (w *worker) create() {
	fl := flavours[w.rng.IntN(len(flavours))]
	req := w.token()
	cr := client.CreateSandboxRequest{Language: "shell", RequestID: req, Labels: map[string]string{reqLabel: req}}
	var snap *snapModel
	switch fl {
	case "network":
		cr.Network = "egress"
	case "root":
		cr.Root = true
	case "snapshot":
		if len(w.snaps) == 0 {
			fl = "plain"
			break
		}
		sm := w.snaps[w.rng.IntN(len(w.snaps))]
		snap = &sm
		cr.FromSnapshot, cr.Language = sm.id, ""
	case "python":
		for _, s := range w.owned {
			if s.flavour == "python" {
				fl = "plain" // one python sandbox per client at most
			}
		}
		if fl == "python" {
			cr.Language = "python"
		}
	}
	var got *client.Sandbox
	err := w.do("create", func(ctx context.Context) (err error) {
		got, err = w.c.CreateSandbox(ctx, cr)
		return err
	})
	if err != nil {
		w.pending = append(w.pending, pendingCreate{req: req, flavour: fl, snap: snap})
		return
	}
	if got.ID == "" || got.State != apitypes.StateReady {
		w.problems = append(w.problems, fmt.Sprintf("create answered %+v, want a ready sandbox", got))
		return
	}
	w.owned = append(w.owned, newSbx(got.ID, fl, snap))
}

func newSbx(id, flavour string, snap *snapModel) *sbx {
	s := &sbx{id: id, flavour: flavour, files: map[string]string{}}
	if snap != nil {
		s.from = snap.origin
		s.files, s.uncertain = maps.Clone(snap.files), snap.uncertain
		s.fresh = slices.Collect(maps.Keys(s.files))
	}
	return s
}

// exec runs a command with output on both streams and an exit code; an
// acknowledged answer must be exactly right.
func (w *worker) exec(s *sbx) {
	a, b := w.token(), w.token()
	req := client.ExecRequest{Command: fmt.Sprintf("echo %s; echo %s >&2; exit 3", a, b)}
	kind := "exec"
	if s.flavour == "vm" {
		kind = "vm_exec"
	}
	var res *client.ExecResult
	err := w.do(kind, func(ctx context.Context) (err error) {
		res, err = w.c.Exec(ctx, s.id, req, nil)
		return err
	})
	if err == nil && (res.ExitCode != 3 || res.Stdout != a+"\n" || res.Stderr != b+"\n") {
		w.problems = append(w.problems, fmt.Sprintf("%s in %s answered exit %d stdout %q stderr %q, want 3 %q %q", kind, s.id, res.ExitCode, res.Stdout, res.Stderr, a+"\n", b+"\n"))
	}
}

// write uploads a new file (a new path each time, so an unacknowledged
// write never makes an acknowledged one uncertain).
func (w *worker) write(s *sbx) {
	path := fmt.Sprintf("/workspace/chaos-%s.txt", w.token())
	body := strings.Repeat(w.token()+"\n", 1+w.rng.IntN(2000))
	err := w.do("write", func(ctx context.Context) error {
		_, err := w.c.WriteFile(ctx, s.id, path, 0o644, false, int64(len(body)), strings.NewReader(body))
		return err
	})
	if err == nil {
		s.files[path] = body
		s.fresh = append(s.fresh, path)
	} else if !w.o.stop.Load() && w.ops["write"].Failed <= 5 {
		w.o.t.Logf("client %d: write to %s (%s) failed with the daemon up: %v", w.n, s.id, s.origin(), err)
	}
}

func (w *worker) snapshot(s *sbx) {
	var snap *client.Snapshot
	err := w.do("snapshot", func(ctx context.Context) (err error) {
		snap, err = w.c.SnapshotSandbox(ctx, s.id, "")
		return err
	})
	if err != nil {
		return
	}
	if snap.ID == "" || snap.SandboxID != s.id {
		w.problems = append(w.problems, fmt.Sprintf("snapshot of %s answered %+v", s.id, snap))
		return
	}
	sm := snapModel{id: snap.ID, files: maps.Clone(s.files), uncertain: s.uncertain, origin: s.origin()}
	s.snaps = append(s.snaps, sm)
	w.snaps = append(w.snaps, sm)
	w.newSnaps = append(w.newSnaps, snap.ID)
}

func (w *worker) restore(s *sbx, sm snapModel) {
	err := w.do("restore", func(ctx context.Context) error {
		_, err := w.c.RestoreSandbox(ctx, s.id, sm.id)
		return err
	})
	if err != nil {
		s.uncertain = true
		return
	}
	s.files, s.uncertain = maps.Clone(sm.files), sm.uncertain
	s.fresh = slices.Collect(maps.Keys(s.files))
	s.restored = append(s.restored, sm.origin)
}

// runCode calls run_code through MCP, the front end agents use for it
// (streamable HTTP on the daemon's socket).
func (w *worker) runCode() {
	tok := w.token()
	var res apitypes.RunResult
	err := w.do("run_code", func(ctx context.Context) error {
		if w.mcp == nil {
			c, err := mcpSession(ctx, w.o.r.d.Socket)
			if err != nil {
				return err
			}
			w.mcp = c
		}
		req := mcp.CallToolRequest{}
		req.Params.Name = "run_code"
		req.Params.Arguments = map[string]any{"language": "python", "code": "print(" + strconv.Quote(tok) + ")\n"}
		out, err := w.mcp.CallTool(ctx, req)
		if err != nil {
			return err
		}
		if out.IsError {
			return errdefs.New(errdefs.Internal, "run_code: tool error %+v", out.Content)
		}
		b, _ := json.Marshal(out.StructuredContent)
		return json.Unmarshal(b, &res)
	})
	if err != nil {
		return
	}
	if !res.Success || res.Stdout != tok+"\n" || res.RunID == "" {
		w.problems = append(w.problems, fmt.Sprintf("run_code answered %+v, want success printing %q", res, tok))
		return
	}
	w.runs = append(w.runs, ackedRun{id: res.RunID, token: tok})
}

// expose starts a web server as a job in the client's python sandbox and
// exposes its port; after the restart it must still be served.
func (w *worker) expose() {
	var s *sbx
	for _, x := range w.owned {
		if x.flavour == "python" && x.port == nil && !x.uncertain {
			s = x
		}
	}
	if s == nil {
		if len(w.owned) < maxOwned {
			w.create()
		}
		return
	}
	var x *client.PortExposure
	err := w.do("expose", func(ctx context.Context) error {
		timeout := 3600.0
		if _, err := w.c.StartJob(ctx, s.id, client.ExecRequest{Argv: []string{"python3", "-m", "http.server", strconv.Itoa(previewPort), "--bind", "127.0.0.1"},
			Cwd: "/workspace", TimeoutSeconds: &timeout}); err != nil {
			return err
		}
		var err error
		x, err = w.c.ExposePort(ctx, s.id, previewPort)
		return err
	})
	if err != nil {
		return
	}
	if x.Port != previewPort || x.Token == "" || x.SandboxID != s.id {
		w.problems = append(w.problems, fmt.Sprintf("expose answered %+v", x))
		return
	}
	s.port, s.portFresh = x, true
}

func (w *worker) terminate(s *sbx) {
	err := w.do("terminate", func(ctx context.Context) error {
		_, err := w.c.TerminateSandbox(ctx, s.id)
		return err
	})
	if err != nil {
		s.uncertain = true
		return
	}
	w.drop(s.id)
	w.termed = append(w.termed, s.id)
}

func (w *worker) drop(id string) {
	w.owned = slices.DeleteFunc(w.owned, func(s *sbx) bool { return s.id == id })
}

// createVM starts the run's one VM (the Linux test guest, under TCG).
func (w *worker) createVM() error {
	req := w.token()
	var vm *client.Sandbox
	err := w.do("vm_create", func(ctx context.Context) (err error) {
		vm, err = w.c.CreateSandbox(ctx, client.CreateSandboxRequest{Backend: "vm", Image: "linux", Labels: map[string]string{reqLabel: req}})
		return err
	})
	if err != nil {
		w.pending = append(w.pending, pendingCreate{req: req, flavour: "vm"})
		return err
	}
	if vm.ID == "" || vm.State != apitypes.StateReady || vm.VM == nil || vm.VM.Accel != "tcg" {
		return fmt.Errorf("vm create answered %+v, want a ready VM under tcg", vm)
	}
	w.o.rep.VM = "created " + vm.ID
	w.owned = append(w.owned, newSbx(vm.ID, "vm", nil))
	return nil
}

// mcpSession opens an MCP session over the daemon's unix socket.
func mcpSession(ctx context.Context, socket string) (*mcpclient.Client, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	c, err := mcpclient.NewStreamableHttpClient("http://sandboxd/mcp", transport.WithHTTPBasicClient(hc))
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "chaos", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func live(s apitypes.State) bool {
	return s == apitypes.StateReady || s == apitypes.StateRunning || s == apitypes.StatePaused
}

// verify checks, after a restart, the state against what the clients
// were told before the kill, and that every half-made sandbox is failed
// with its reason and released.
func (o *orchestrator) verify(epoch int) {
	t := o.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := o.r.client()
	defer c.Close()
	fail := func(format string, args ...any) {
		t.Errorf("after kill %d: "+format, append([]any{epoch}, args...)...)
	}
	all, err := c.ListSandboxes(ctx, "all")
	if err != nil {
		t.Fatalf("after kill %d: list sandboxes: %v", epoch, err)
	}
	byID := map[string]client.Sandbox{}
	byReq := map[string]client.Sandbox{}
	for _, s := range all {
		byID[s.ID] = s
		if req := s.Labels[reqLabel]; req != "" {
			byReq[req] = s
		}
	}

	// Half-made sandboxes: failed, with the reason, and released; none
	// left creating.
	st := o.r.openStore()
	defer st.Close()
	loops := loopDevices(t)
	for _, s := range all {
		switch {
		case s.State == apitypes.StateCreating:
			fail("%s is still %s after the restart", s.ID, s.State)
		case (s.State == apitypes.StateFailed || s.State == apitypes.StateTerminated) && !o.checked[s.ID]:
			o.checked[s.ID] = true
			if s.State == apitypes.StateFailed {
				o.rep.HalfMadeFailed++
				if s.Reason == "" {
					fail("%s is failed without a reason", s.ID)
				}
			}
			if held := o.r.released(st, s.ID, loops); len(held) != 0 {
				fail("%s is %s (%s) but still holds %v", s.ID, s.State, s.Reason, held)
			}
			o.rep.Verified.Released++
		}
	}

	known := map[string]bool{}
	for _, w := range o.workers {
		// Unanswered creates: the sandbox, if any, is live (the answer
		// was lost) or failed with its reason (checked above).
		for _, p := range w.pending {
			s, ok := byReq[p.req]
			if !ok {
				continue // it never reached the daemon's state
			}
			o.rep.Verified.PendingSeen++
			if live(s.State) {
				w.owned = append(w.owned, newSbx(s.ID, p.flavour, p.snap))
				o.rep.Verified.PendingLive++
			}
		}
		w.pending = nil
		for _, s := range slices.Clone(w.owned) {
			rec, ok := byID[s.id]
			switch {
			case !ok:
				fail("acknowledged sandbox %s (%s) is not in the state", s.id, s.flavour)
				w.drop(s.id)
				continue
			case !live(rec.State) && s.uncertain:
				w.drop(s.id) // its unanswered terminate or restore got that far
				continue
			case !live(rec.State) && rec.State == apitypes.StateFailed && rec.Reason != "":
				// Allowed (failed with its reason), but counted: an
				// acknowledged sandbox should have been adopted.
				o.rep.AckedThenFailed++
				t.Logf("after kill %d: acknowledged sandbox %s (%s) is failed: %s", epoch, s.id, s.flavour, rec.Reason)
				w.drop(s.id)
				continue
			case !live(rec.State):
				fail("acknowledged sandbox %s (%s) is %s (%q) after the restart; no client terminated it", s.id, s.flavour, rec.State, rec.Reason)
				w.drop(s.id)
				continue
			}
			known[s.id] = true
			o.rep.Verified.Sandboxes++
			o.checkFiles(ctx, c, epoch, s)
			o.checkPort(ctx, c, epoch, s)
		}
		for _, id := range w.termed {
			if s, ok := byID[id]; ok && s.State != apitypes.StateTerminated {
				fail("sandbox %s was terminated (acknowledged) but is %s", id, s.State)
			}
			o.rep.Verified.Terminated++
		}
		w.termed = nil
		for _, id := range w.newSnaps {
			if _, err := c.GetSnapshot(ctx, id); err != nil {
				fail("acknowledged snapshot %s: %v", id, err)
			}
			o.rep.Verified.Snapshots++
		}
		w.newSnaps = nil
		for _, run := range w.runs {
			rec, err := c.Run(ctx, run.id, 4096)
			if err != nil {
				fail("acknowledged run_code %s: %v", run.id, err)
				continue
			}
			if !rec.Metadata.Success || rec.Stdout != run.token+"\n" {
				fail("run record %s: success %v stdout %q, want %q", run.id, rec.Metadata.Success, rec.Stdout, run.token+"\n")
			}
			o.rep.Verified.Runs++
		}
		w.runs = nil
	}

	// Live sandboxes no client knows must be run_code's own sandboxes
	// whose run the kill interrupted: the restarted daemon adopts them,
	// with no run left to end them, until sandbox.idle_timeout. Reported
	// (orphaned_run_sandboxes), and removed so that they do not pile up
	// towards sandbox.max_sandboxes.
	var netLive int
	for _, s := range all {
		if !live(s.State) {
			continue
		}
		if known[s.ID] && s.Network != "" && s.Network != "none" {
			netLive++
		}
		if !known[s.ID] && s.Labels[runLabel] == "" {
			fail("live sandbox %s (%s, labels %v) belongs to no client and to no run", s.ID, s.Language, s.Labels)
		}
		if !known[s.ID] {
			o.rep.OrphanRunSandboxes++
			t.Logf("after kill %d: live sandbox %s (%s) belongs to no client (an interrupted run_code's?); terminating it", epoch, s.ID, s.Language)
			if _, err := c.TerminateSandbox(ctx, s.ID); err != nil {
				fail("terminate %s: %v", s.ID, err)
			}
		}
	}
	// One veth per live sandbox with network, no more (the ones just
	// terminated took theirs along).
	if vs, _ := o.r.veths(); len(vs) != netLive {
		fail("%d sandbox veths in the simulated host, want %d (live sandboxes with network): %v", len(vs), netLive, vs)
	}
}

// checkFiles reads back the files acknowledged since the last check and a
// few older ones.
func (o *orchestrator) checkFiles(ctx context.Context, c *client.Client, epoch int, s *sbx) {
	if s.uncertain || s.flavour == "vm" {
		s.fresh = nil
		return
	}
	paths := s.fresh
	older := slices.Sorted(maps.Keys(s.files))
	for range 2 {
		if len(older) > 0 {
			paths = append(paths, older[o.checkRng.IntN(len(older))])
		}
	}
	for _, p := range paths {
		want, ok := s.files[p]
		if !ok {
			continue // replaced by a restore since
		}
		var got strings.Builder
		if _, err := c.ReadFile(ctx, s.id, p, 0, 0, &got); err != nil {
			o.t.Errorf("after kill %d: acknowledged write %s in %s (%s): %v", epoch, p, s.id, s.flavour, err)
		} else if got.String() != want {
			o.t.Errorf("after kill %d: acknowledged write %s in %s: %d bytes read back, want %d", epoch, p, s.id, got.Len(), len(want))
		}
		o.rep.Verified.Files++
	}
	s.fresh = nil
}

// checkPort checks that an acknowledged exposure is still listed and
// served by the restarted daemon (the server, a job, outlived the kill).
func (o *orchestrator) checkPort(ctx context.Context, c *client.Client, epoch int, s *sbx) {
	if s.port == nil || s.uncertain {
		return
	}
	xs, err := c.Ports(ctx, s.id)
	if err != nil {
		o.t.Errorf("after kill %d: ports of %s: %v", epoch, s.id, err)
		return
	}
	var x *client.PortExposure
	for i := range xs {
		if xs[i].Port == s.port.Port {
			x = &xs[i]
		}
	}
	if x == nil || x.Token != s.port.Token {
		o.t.Errorf("after kill %d: acknowledged exposure of port %d of %s: listed %+v", epoch, s.port.Port, s.id, xs)
		return
	}
	if !s.portFresh && o.checkRng.IntN(3) != 0 {
		return
	}
	s.portFresh = false
	var code int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, err = o.r.previewGet(ctx, x.BaseURL, x.TokenHeader, x.Token)
		if err == nil && code == http.StatusOK || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || code != http.StatusOK {
		o.t.Errorf("after kill %d: preview of port %d of %s: %d %v", epoch, x.Port, s.id, code, err)
	}
	o.rep.Verified.Ports++
}

// endAll terminates every sandbox, runs gc, stops the daemon and counts
// what is left on the host.
func (o *orchestrator) endAll() {
	t := o.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := o.r.client()
	defer c.Close()
	all, err := c.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if _, err = c.TerminateSandbox(ctx, s.ID); err != nil {
			t.Errorf("terminate %s: %v", s.ID, err)
		}
	}
	if _, err := c.GC(ctx); err != nil {
		t.Errorf("gc: %v", err)
	}
	if left, err := c.ListSandboxes(ctx, ""); err != nil || len(left) != 0 {
		t.Errorf("live after terminating all: %v %v", left, err)
	}
	// Every half-made or terminated sandbox is released.
	all, err = c.ListSandboxes(ctx, "all")
	if err != nil {
		t.Fatal(err)
	}
	st := o.r.openStore()
	loops := loopDevices(t)
	for _, s := range all {
		if held := o.r.released(st, s.ID, loops); len(held) != 0 {
			t.Errorf("at the end, %s (%s) still holds %v", s.ID, s.State, held)
		}
	}
	st.Close()
	o.rep.Leftovers = o.r.finalLeftovers()
	if o.rep.Leftovers == nil {
		o.rep.Leftovers = []string{}
	}
}

// finish prints the figures and writes them to $CHAOS_REPORT; it runs
// also when the test stopped early.
func (o *orchestrator) finish(began time.Time) {
	rep := &o.rep
	for _, w := range o.workers {
		for k, oc := range w.ops {
			sum := rep.Ops[k]
			if sum == nil {
				sum = &opCount{Codes: map[string]int{}}
				rep.Ops[k] = sum
			}
			sum.Acked += oc.Acked
			sum.Failed += oc.Failed
			for c, n := range oc.Codes {
				sum.Codes[c] += n
			}
			rep.Acked += oc.Acked
			rep.Failed += oc.Failed
		}
		rep.ClientTimeouts += w.timeouts
		if d, _ := time.ParseDuration(rep.ReturnAfterKillMax); w.maxAfterKill > d {
			rep.ReturnAfterKillMax = w.maxAfterKill.Round(time.Millisecond).String()
		}
	}
	// The first start is not a restart.
	restarts := rep.readies
	if len(restarts) > 0 {
		restarts = restarts[1:]
	}
	rep.RestartToReadyP50 = percentile(restarts, 50).Round(time.Millisecond).String()
	rep.RestartToReadyP99 = percentile(restarts, 99).Round(time.Millisecond).String()
	rep.RestartToReadyMax = percentile(restarts, 100).Round(time.Millisecond).String()
	rep.Duration = time.Since(began).Round(time.Second).String()
	b, _ := json.MarshalIndent(rep, "", "  ")
	o.t.Logf("chaos figures (CHAOS_SEED=%d):\n%s", rep.Seed, b)
	if p := os.Getenv("CHAOS_REPORT"); p != "" {
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			o.t.Errorf("write %s: %v", p, err)
		}
	}
}
