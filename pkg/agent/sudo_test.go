package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestSudoChannel runs the agent's sudo client against a root-mode agent
// whose default user is nobody, both in a network namespace of their own
// (the channel's abstract socket lives there, as in a sandbox).
func TestSudoChannel(t *testing.T) {
	testenv.RequireRoot(t)
	a := startAgentWrapped(t, []string{"unshare", "--net", "--fork"}, "--uid", "65534", "--gid", "65534", "--root-mode")
	sudo := filepath.Join(t.TempDir(), "sudo")
	if err := os.Symlink(agentBin, sudo); err != nil {
		t.Fatal(err)
	}
	// asNobody runs sudo args as nobody in the agent's network namespace.
	asNobody := func(stdin string, args ...string) *exec.Cmd {
		cmd := exec.Command("nsenter", append([]string{"--net=/proc/" + fmt.Sprint(a.pid) + "/ns/net",
			"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sudo}, args...)...)
		cmd.Dir = "/"
		cmd.Stdin = strings.NewReader(stdin)
		return cmd
	}
	run := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := asNobody(stdin, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("sudo %v: %v", args, err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}

	if out, errs, code := run("", "id", "-u"); out != "0\n" || code != 0 {
		t.Errorf("sudo id -u: %q %q exit %d, want 0", out, errs, code)
	}
	if out, errs, code := run("", "-u", "nobody", "id", "-u"); out != "65534\n" || code != 0 {
		t.Errorf("sudo -u nobody id -u: %q %q exit %d", out, errs, code)
	}
	// Standard descriptors are the caller's own; the exit status is the command's.
	if out, errs, code := run("hello\n", "sh", "-c", "read x; echo got $x; echo oops >&2; exit 5"); out != "got hello\n" || errs != "oops\n" || code != 5 {
		t.Errorf("sudo sh: %q %q exit %d, want got hello / oops / 5", out, errs, code)
	}
	// env_reset: the caller's variables stay behind, sudo's are set.
	cmd := asNobody("", "sh", "-c", "echo $HOME $USER $SUDO_USER ${SECRET:-unset}")
	cmd.Env = append(os.Environ(), "SECRET=x")
	if out, err := cmd.Output(); err != nil || string(out) != "/root root nobody unset\n" {
		t.Errorf("sudo environment: %q %v", out, err)
	}
	if _, errs, code := run("", "-X", "true"); code != 1 || !strings.Contains(errs, "-X is not supported") {
		t.Errorf("sudo -X: %q exit %d", errs, code)
	}

	// A signal to the client reaches the command (in its own session).
	term := asNobody("", "sleep", "1234.5")
	if err := term.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sleep 1234.5 under sudo", func() bool { return pgrep("sleep 1234.5") })
	// nsenter and setpriv exec, so the process started is sudo's client.
	_ = term.Process.Signal(syscall.SIGTERM)
	_ = term.Wait()
	if code := term.ProcessState.ExitCode(); code != 143 {
		t.Errorf("sudo sleep after SIGTERM: exit %d, want 143", code)
	}
	waitFor(t, "sleep 1234.5 gone", func() bool { return !pgrep("sleep 1234.5") })

	// The client killed outright: the command does not outlive it.
	kill := asNobody("", "sleep", "1234.6")
	if err := kill.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sleep 1234.6 under sudo", func() bool { return pgrep("sleep 1234.6") })
	_ = kill.Process.Kill()
	_ = kill.Wait()
	waitFor(t, "sleep 1234.6 gone", func() bool { return !pgrep("sleep 1234.6") })

	// The daemon's job list does not show sudo's commands.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if jobs, err := a.Jobs(ctx); err != nil || len(jobs) != 0 {
		t.Errorf("jobs after sudo: %+v %v, want none", jobs, err)
	}

	// Outside the agent's network namespace there is no channel.
	out, err := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sudo, "id").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no root to give") {
		t.Errorf("sudo without a channel: %q %v", out, err)
	}
}

func pgrep(pattern string) bool {
	return exec.Command("pgrep", "-f", "^"+pattern+"$").Run() == nil
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
