package hostclaim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// holdEnv makes the test binary a holder (TestHold) instead of a test run.
const holdEnv = "HOSTCLAIM_TEST_HOLD"

// TestHold is not a test: run by holder with holdEnv set, it claims what
// the variable names ("name:X" or "path:X"), says "held" and keeps the
// claim until its stdin closes.
func TestHold(t *testing.T) {
	what := os.Getenv(holdEnv)
	if what == "" {
		return // a test run, not a holder: nothing to do
	}
	kind, arg, _ := strings.Cut(what, ":")
	var c *Claim
	var err error
	if kind == "name" {
		c, err = Name(arg, "network.bridge", arg)
	} else {
		c, err = Path(arg, "paths.run_dir")
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = c.Release()
	os.Exit(0)
}

// holder runs a process that claims what (see TestHold) as a daemon of
// stateDir would (its marker set); kill ends it.
func holder(t *testing.T, what, stateDir string) (pid int, kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHold$")
	cmd.Env = append(lifetime.Unmarked(os.Environ()), holdEnv+"="+what, lifetime.Marker(stateDir))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		stdin.Close()
	}
	t.Cleanup(kill)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("holder: %q %v", line, err)
	}
	return cmd.Process.Pid, kill
}

// TestClaimsRefuseSecondHolder: a name or path another process holds is
// refused naming the setting, the holder's pid and state dir; once the
// holder is killed (SIGKILL: no cleanup of its own) it is free at once.
func TestClaimsRefuseSecondHolder(t *testing.T) {
	name := fmt.Sprintf("test/%d", os.Getpid())
	dir := t.TempDir()
	for _, c := range []struct {
		what, setting string
		claim         func() (*Claim, error)
	}{
		{"name:" + name, "network.bridge", func() (*Claim, error) { return Name(name, "network.bridge", name) }},
		{"path:" + dir, "paths.run_dir", func() (*Claim, error) { return Path(dir, "paths.run_dir") }},
	} {
		t.Run(c.setting, func(t *testing.T) {
			stateDir := filepath.Join(t.TempDir(), "state")
			pid, kill := holder(t, c.what, stateDir)
			_, err := c.claim()
			var inUse *InUseError
			if !errors.As(err, &inUse) {
				t.Fatalf("claim held by pid %d: %v, want an InUseError", pid, err)
			}
			if inUse.PID != pid || inUse.StateDir != stateDir || inUse.Setting != c.setting {
				t.Errorf("InUseError %+v, want pid %d, state dir %s, setting %s", inUse, pid, stateDir, c.setting)
			}
			want := fmt.Sprintf("another mcp-sandboxd (pid %d, state dir %s); give this daemon its own %s", pid, stateDir, c.setting)
			if !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), c.setting+": ") {
				t.Errorf("error %q, want it to start with %q and contain %q", err, c.setting+": ", want)
			}
			kill()
			cl, err := c.claim()
			if err != nil {
				t.Fatalf("claim after the holder was killed: %v", err)
			}
			if err := cl.Release(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNameReleased: a released name can be claimed again, a held one not
// even by its own process.
func TestNameReleased(t *testing.T) {
	name := fmt.Sprintf("test-own/%d", os.Getpid())
	c, err := Name(name, "network.subnet", "10.0.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	var inUse *InUseError
	if _, err := Name(name, "network.subnet", "10.0.0.0/24"); !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second claim in the holder: %v, want an InUseError naming pid %d", err, os.Getpid())
	}
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	c2, err := Name(name, "network.subnet", "10.0.0.0/24")
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	_ = c2.Release()
}
