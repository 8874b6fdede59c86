package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
)

// TestCrashAtEveryAcquisition kills the daemon (SIGKILL, from inside, at a
// crash point) after each step of a sandbox's start in turn, restarts it,
// and checks that the resource ledger was walked: every cgroup, mount,
// state dir and process of the half-made sandbox is gone and it is recorded
// as failed — or, past the ready transition, that it was adopted and works.
func TestCrashAtEveryAcquisition(t *testing.T) {
	points := []string{
		sandbox.CrashAfterRecord,
		container.CrashAfterDir,
		container.CrashAfterImage,
		container.CrashAfterLoop,
		container.CrashAfterMount,
		container.CrashAfterLayers,
		container.CrashAfterContainer,
		sandbox.CrashAfterAgent,
		sandbox.CrashAfterReady,
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			d := testenv.NewDaemon(t)
			d.ExtraEnv = []string{crashpoint.EnvVar + "=" + point}
			d.Start()
			out, errOut, code := d.Ctl("create", "--lang", "shell")
			if code == 0 {
				t.Fatalf("create succeeded (%q) although the daemon was to crash at %s", out, point)
			}
			if err := d.WaitExited(30 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("daemon exit: %v (create said %q), want killed by its crash point", err, errOut)
			}
			d.ExtraEnv = nil
			d.Start()

			var all []struct {
				ID    string `json:"sandbox_id"`
				State string `json:"state"`
			}
			if err := json.Unmarshal([]byte(d.MustCtl("ps", "--all", "--json")), &all); err != nil || len(all) != 1 {
				t.Fatalf("sandboxes after restart: %+v (%v), want the one being created", all, err)
			}
			id := all[0].ID
			if point == sandbox.CrashAfterReady {
				if all[0].State != "ready" {
					t.Fatalf("%s after restart: %s, want ready (adopted)", id, all[0].State)
				}
				if got := d.MustCtl("exec", id, "--", "echo", "adopted"); got != "adopted\n" {
					t.Fatalf("exec in the adopted sandbox: %q", got)
				}
				return // the cleanup terminates it and checks for leftovers
			}
			if all[0].State != "failed" {
				t.Fatalf("%s after restart: %s, want failed", id, all[0].State)
			}
			// Reconciliation released everything already: nothing is left for
			// gc, and nothing of the sandbox is on the host.
			testenv.AssertNoLeftovers(t, d.Config)
			if procs := testenv.ProcessesInCgroup(d.Config.Sandbox.CgroupParent); len(procs) != 0 {
				t.Errorf("processes left in the sandboxes' cgroups: %v", procs)
			}
			var gc struct {
				Removed []string `json:"removed"`
				Errors  []string `json:"errors"`
			}
			if err := json.Unmarshal([]byte(d.MustCtl("gc", "--json")), &gc); err != nil {
				t.Fatal(err)
			}
			if len(gc.Removed) != 0 || len(gc.Errors) != 0 {
				t.Errorf("gc after restart found %+v: reconciliation left it", gc)
			}
		})
	}
}
