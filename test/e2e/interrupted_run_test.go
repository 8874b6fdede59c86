package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestInterruptedRunSandboxEnds: a run_code whose daemon is killed mid-run
// leaves its ephemeral sandbox with nobody to end it; the restarted daemon
// terminates it at once instead of letting it idle until its timeout.
func TestInterruptedRunSandboxEnds(t *testing.T) {
	d := testenv.NewDaemon(t, "python")
	d.Start()
	src := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(src, []byte("import time\nprint('started', flush=True)\ntime.sleep(120)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(filepath.Join(d.Bin, "sandboxctl"), "--socket", d.Socket, "run", "--lang", "python", src)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer run.Wait() //nolint:errcheck // it fails when the daemon dies; that is the point

	// The run's sandbox, by its label, once it is up (the crash may come
	// at any step of the run from then on).
	type sb struct {
		ID     string            `json:"sandbox_id"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
	}
	var runSandbox string
	for deadline := time.Now().Add(60 * time.Second); runSandbox == ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			out, _, _ := d.Ctl("ps", "--json")
			t.Fatalf("the run's sandbox never came up; sandboxctl ps --json: %s", out)
		}
		var all []sb
		if err := json.Unmarshal([]byte(d.MustCtl("ps", "--json")), &all); err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			if s.Labels["sandboxd.run"] != "" && (s.State == "running" || s.State == "ready") {
				runSandbox = s.ID
			}
		}
	}
	// A sandbox of its own, not a run's: it must survive the restart.
	bystander := createSandbox(d)

	d.Crash()
	d.Start()
	waitState(t, d, runSandbox, "terminated")
	if s := sandboxState(t, d, bystander); s != "ready" {
		t.Errorf("a sandbox that is not a run's after the restart: %s, want ready", s)
	}
	if log := d.Log(); !strings.Contains(log, "terminated the sandbox of an interrupted run") {
		t.Errorf("the daemon's log does not say why it ended %s", runSandbox)
	}
}
