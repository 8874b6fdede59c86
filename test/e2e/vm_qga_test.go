package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// TestVMQGADaemon: a daemon whose vm.images.linux is an administrator's
// disk (the Linux test guest made into a UEFI boot disk, running only
// Debian's qemu-ga), driven with sandboxctl over REST: vm create streams
// its progress to stderr and prints the id, vm exec -c and argv go
// through qemu-ga (exit code kept), vm cp in and out through the REST
// file routes, exec through the sandbox route is refused with the clear
// error; SIGKILL of the daemon, a restart that adopts the VM and reads the
// file back; vm rm leaves nothing.
func TestVMQGADaemon(t *testing.T) {
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("boots a VM")
	}
	disk := filepath.Join(t.TempDir(), "admin-linux.qcow2")
	if err := vm.MakeBootDisk(context.Background(), vmenv.Guest(t), disk); err != nil {
		t.Fatal(err)
	}
	d := testenv.NewDaemon(t)
	d.Config.VM.Images = map[string]string{vm.OSLinux: disk}
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()

	t0 := time.Now()
	out, errOut, code := d.Ctl("vm", "create")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") || !strings.Contains(errOut, "vm: booting linux from "+disk) {
		t.Fatalf("vm create: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("QGA VM %s created through the daemon in %v", id, time.Since(t0))
	if got := d.MustCtl("vm", "exec", "-c", "uname -r; id -u", id); !strings.HasSuffix(got, "-cloud-amd64\n0\n") {
		t.Errorf("vm exec -c: %q", got)
	}
	if _, _, code := d.Ctl("vm", "exec", id, "--", "sh", "-c", "exit 5"); code != 5 {
		t.Errorf("vm exec exit code: %d", code)
	}
	src := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(src, []byte("through qemu-ga\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.MustCtl("vm", "cp", src, id+":/root/in/in.txt")
	if got := d.MustCtl("vm", "cp", id+":/root/in/in.txt", "-"); got != "through qemu-ga\n" {
		t.Errorf("vm cp out: %q", got)
	}
	if _, errOut, code := d.Ctl("exec", id, "--", "true"); code == 0 || !strings.Contains(errOut, "only the QEMU guest agent") {
		t.Errorf("sandbox exec on a QGA VM: exit %d %q", code, errOut)
	}
	if got := d.MustCtl("vm", "inspect", id); !strings.Contains(got, `"guest_agent": "qemu-ga"`) && !strings.Contains(got, `"guest_agent":"qemu-ga"`) {
		t.Errorf("vm inspect: %s", got)
	}
	// kill -9 of the daemon with the VM running; the restarted daemon
	// adopts it and reconnects to its guest agent.
	d.Crash()
	d.Start()
	if got := d.MustCtl("vm", "cp", id+":/root/in/in.txt", "-"); got != "through qemu-ga\n" {
		t.Errorf("vm cp out after the crash: %q", got)
	}
	if log, _ := os.ReadFile(d.LogPath); !strings.Contains(string(log), "adopted sandbox without an agent") {
		t.Errorf("no adoption in the daemon's log:\n%s", d.Log())
	}
	d.MustCtl("vm", "rm", id)
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("live after vm rm: %v", ids)
	}
}
