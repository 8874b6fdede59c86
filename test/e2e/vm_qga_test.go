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
// Debian's qemu-ga), driven with sandboxctl over REST /v1/sandboxes:
// create --backend vm streams its progress to stderr and prints the id,
// exec of a shell line and of argv go through qemu-ga (exit code kept), cp
// in and out through the file routes, a background job is refused naming
// the capability; SIGKILL of the daemon, a restart that adopts the VM and
// reads the file back; rm leaves nothing.
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
	out, errOut, code := d.Ctl("create", "--backend", "vm")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") || !strings.Contains(errOut, "create: booting linux from "+disk) {
		t.Fatalf("create --backend vm: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("QGA VM %s created through the daemon in %v", id, time.Since(t0))
	if got := d.MustCtl("exec", id, "--", "sh", "-c", "uname -r; id -u"); !strings.HasSuffix(got, "-cloud-amd64\n0\n") {
		t.Errorf("exec of a shell line through qemu-ga: %q", got)
	}
	if _, _, code := d.Ctl("exec", id, "--", "sh", "-c", "exit 5"); code != 5 {
		t.Errorf("exec exit code through qemu-ga: %d", code)
	}
	src := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(src, []byte("through qemu-ga\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.MustCtl("cp", src, id+":/root/in/in.txt")
	if got := d.MustCtl("cp", id+":/root/in/in.txt", "-"); got != "through qemu-ga\n" {
		t.Errorf("cp out through qemu-ga: %q", got)
	}
	if _, errOut, code := d.Ctl("exec", "-d", id, "--", "true"); code == 0 || !strings.Contains(errOut, "only the QEMU guest agent") || !strings.Contains(errOut, "jobs capability") {
		t.Errorf("a background job on a QGA VM: exit %d %q", code, errOut)
	}
	if got := d.MustCtl("inspect", id); !strings.Contains(got, `"guest_agent": "qemu-ga"`) && !strings.Contains(got, `"guest_agent":"qemu-ga"`) {
		t.Errorf("inspect: %s", got)
	}
	// kill -9 of the daemon with the VM running; the restarted daemon
	// adopts it and reconnects to its guest agent.
	d.Crash()
	d.Start()
	if got := d.MustCtl("cp", id+":/root/in/in.txt", "-"); got != "through qemu-ga\n" {
		t.Errorf("cp out after the crash: %q", got)
	}
	if log, _ := os.ReadFile(d.LogPath); !strings.Contains(string(log), "adopted sandbox without an agent") {
		t.Errorf("no adoption in the daemon's log:\n%s", d.Log())
	}
	d.MustCtl("rm", id)
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("live after rm: %v", ids)
	}
}
