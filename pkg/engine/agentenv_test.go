package engine

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
)

// TestAgentEnvironment: the sandbox's agent starts with the Go runtime's
// memory profiler off (GODEBUG=memprofilerate=0, which only the
// environment can set before the runtime's first allocation; see
// pkg/sandbox/container agentInitEnv), and its commands do not inherit
// that setting: a Go program the user runs profiles as it would anywhere.
func TestAgentEnvironment(t *testing.T) {
	env := newTestEngine(t)
	ctx := context.Background()
	sb := env.create(t, CreateSandboxRequest{Language: "shell"})
	d, err := env.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cgroups.Procs(d.CgroupPath)
	if err != nil {
		t.Fatal(err)
	}
	var agentEnv []string
	for _, pid := range pids {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmdline), "--listen-fd") {
			continue // exited, or the spare job helper
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		agentEnv = strings.Split(strings.TrimRight(string(environ), "\x00"), "\x00")
	}
	if agentEnv == nil {
		t.Fatalf("no agent among the processes %v of %s", pids, sb.ID)
	}
	if !slices.Contains(agentEnv, "GODEBUG=memprofilerate=0") {
		t.Errorf("agent environment %q lacks GODEBUG=memprofilerate=0", agentEnv)
	}
	res := env.sh(t, sb.ID, `printf 'GODEBUG=[%s]\n' "$GODEBUG"`)
	if res.ExitCode != 0 || res.Stdout != "GODEBUG=[]\n" {
		t.Errorf("a command sees the agent's GODEBUG: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}
