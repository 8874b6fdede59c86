//go:build testhooks

package adversarial

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/landlock"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runtime"
)

// TestLandlockRefusesUndeclaredMount makes the mount mistake Landlock is
// there for: the runtime's test hook (pkg/runtime/testhook_mounts.go, in
// -tags testhooks builds only) binds a host directory into every sandbox
// without declaring it. With sandbox.landlock off the host's file is
// readable in the sandbox, through a command and through the file API —
// the mistake is real. With Landlock, the same sandboxes refuse it to
// commands (normal and root mode) and to the agent's own file operations,
// while everything the sandbox declared still works.
func TestLandlockRefusesUndeclaredMount(t *testing.T) {
	if landlock.ABI() < landlock.MinABI {
		t.Fatalf("this kernel's Landlock ABI is %d: the test needs %d or later", landlock.ABI(), landlock.MinABI)
	}
	testenv.EnsureImages(t, "python")
	hostDir := t.TempDir()
	secret := "host-secret-" + testenv.RandHex(8)
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(runtime.UndeclaredMountEnv, hostDir+":/mnt/leak")
	ctx := context.Background()
	read := "cat /mnt/leak/secret; echo rc=$?"

	for _, mode := range []landlock.Mode{landlock.ModeOff, landlock.ModeRequire} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := testenv.Config(t, "ll")
			cfg.Sandbox.Landlock = string(mode)
			e, err := engine.New(ctx, cfg, testenv.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			cleanupEngine(t, e, cfg)
			st, err := e.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Landlock != (mode == landlock.ModeRequire) || st.LandlockABI != landlock.ABI() {
				t.Errorf("status: landlock %v, ABI %d (kernel %d)", st.Landlock, st.LandlockABI, landlock.ABI())
			}
			for _, root := range []bool{false, true} {
				sb, err := e.CreateSandbox(ctx, engine.CreateSandboxRequest{Language: "python", Root: root})
				if err != nil {
					t.Fatal(err)
				}
				res := mustExec(t, e, sb.ID, read)
				out := res.Stdout + res.Stderr
				_, ferr := e.ReadFile(ctx, engine.FileReadRequest{SandboxID: sb.ID, Path: "/mnt/leak/secret"})
				if mode == landlock.ModeOff {
					// Without the layer the mistake exposes the host's file.
					if !strings.Contains(out, secret) || ferr != nil {
						t.Fatalf("root=%v: the hook's mount is not readable without Landlock (the test would prove nothing): %q, file API: %v", root, out, ferr)
					}
					continue
				}
				if strings.Contains(out, secret) || !strings.Contains(out, "Permission denied") {
					t.Errorf("root=%v: a command read the undeclared mount: %q", root, out)
				}
				if ferr == nil || !strings.Contains(ferr.Error(), "permission denied") {
					t.Errorf("root=%v: the file API read the undeclared mount: %v, want permission denied", root, ferr)
				}
				// What the sandbox declared is untouched: the image's
				// programs, the workspace (a rename across directories needs
				// Landlock's refer right), /proc, /dev. The root cannot be
				// listed: it is split around the undeclared mount
				// (pkg/landlock, plan).
				res = mustExec(t, e, sb.ID, "python3 -c 'print(6*7)' && mkdir -p /workspace/d && echo w > /workspace/f && mv /workspace/f /workspace/d/f && cat /workspace/d/f && ls /workspace/d && head -c4 /proc/self/status && echo x > /dev/null && ls /dev /dev/pts /sys /sys/fs/cgroup /proc /.sandboxd >/dev/null && echo; echo rc=$?; ls / >/dev/null; echo ls-root=$?")
				if res.Stdout != "42\nw\nf\nName\nrc=0\nls-root=2\n" {
					t.Errorf("root=%v: declared paths under Landlock: %q %q", root, res.Stdout, res.Stderr)
				}
			}
		})
	}
}
