package runtime

import (
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// exitString describes a reaped init as os.ProcessState.String does: the
// termination reason of a sandbox whose init died reads the same as
// before init was reaped with wait4 instead of exec.Cmd.Wait.
func TestExitStringMatchesProcessState(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		kill bool
	}{
		{"exit status", []string{"sh", "-c", "exit 3"}, false},
		{"success", []string{"true"}, false},
		{"signal", []string{"sleep", "60"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.kill {
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			_ = cmd.Wait()
			ws := unix.WaitStatus(cmd.ProcessState.Sys().(syscall.WaitStatus))
			if got, want := exitString(ws, nil), cmd.ProcessState.String(); got != want {
				t.Errorf("exitString = %q, os.ProcessState says %q", got, want)
			}
		})
	}
	if got := exitString(0, unix.ECHILD); got != unix.ECHILD.Error() {
		t.Errorf("exitString after a failed wait = %q, want the error", got)
	}
}
