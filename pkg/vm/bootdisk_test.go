package vm_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// TestBootDisk makes a UEFI boot disk from the Linux test guest — what an
// administrator's stock Linux image (vm.images.linux) looks like: it boots
// through the firmware and runs Debian's qemu-ga alone — and boots it as a
// DiskGuest on q35 (the Windows profile's machine) with OVMF, no kernel
// from the host. SANDBOXD_VM_BOOTS=n (default 1) boots it n times and logs
// the median boot-to-qemu-ga time.
func TestBootDisk(t *testing.T) {
	testenv.RequireRoot(t)
	g := vmenv.Guest(t)
	// The accelerator probe boots a kernel: a disk guest has none to offer,
	// so probe with the guest's (once per process).
	accel, reason := vm.DetectAccel(vm.DefaultQEMU, g.Kernel)
	t.Logf("accelerator %s: %s", accel, reason)

	if err := vm.MakeBootDisk(ctxT(t, time.Minute), vm.DiskGuest(vm.OSLinux, g.Disk), filepath.Join(t.TempDir(), "x.qcow2")); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("boot disk from a disk guest: %v, want invalid_argument", err)
	}

	dir := t.TempDir()
	disk := filepath.Join(dir, "boot.qcow2")
	t0 := time.Now()
	if err := vm.MakeBootDisk(ctxT(t, 5*time.Minute), g, disk); err != nil {
		t.Fatal(err)
	}
	t.Logf("boot disk built in %v", time.Since(t0))
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Fatalf("temporary files left beside the disk: %v", left)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", disk).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
		ActualSize  int64  `json:"actual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Format != "qcow2" || info.VirtualSize <= g.DiskBytes {
		t.Fatalf("boot disk: %s (%v), want qcow2 larger than the root disk (%d)", out, err, g.DiskBytes)
	}
	t.Logf("boot disk: virtual %d MiB, %d MiB on disk", info.VirtualSize>>20, info.ActualSize>>20)

	n := 1
	if s := os.Getenv("SANDBOXD_VM_BOOTS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	var boots []time.Duration
	for i := range n {
		s := newSpec(t, vm.DiskGuest(vm.OSLinux, disk))
		s.Firmware = &vm.Firmware{Code: vm.OVMFCode, Vars: vm.OVMFVars}
		v, d := start(t, s)
		boots = append(boots, d)
		t.Logf("boot %d: firmware boot to ready qemu-ga: %v", i+1, d)
		if i == 0 {
			checkBootDiskGuest(t, v, g)
		}
		dir, pid := v.Dir(), v.PID()
		if err := v.Destroy(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
		assertGone(t, dir, pid, s.Cgroup)
	}
	t.Logf("firmware boot to ready qemu-ga: median %v of %v", median(boots), boots)
}

// checkBootDiskGuest checks a booted boot disk through qemu-ga.
func checkBootDiskGuest(t *testing.T, v *vm.VM, g *vm.Guest) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	c, err := v.QGA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Version == "" {
		t.Fatalf("guest-info: %+v %v", info, err)
	}
	var hasExec bool
	for _, cmd := range info.Commands {
		hasExec = hasExec || cmd.Name == "guest-exec" && cmd.Enabled
	}
	if !hasExec {
		t.Fatalf("guest-info: qemu-ga %s without guest-exec", info.Version)
	}
	t.Logf("qemu-ga %s, %d commands", info.Version, len(info.Commands))

	if res := sh(t, v, "uname -r"); strings.TrimSpace(string(res.Stdout)) != g.Release || res.ExitCode != 0 {
		t.Fatalf("uname -r: %q (exit %d), want %q", res.Stdout, res.ExitCode, g.Release)
	}
	// Booted by the firmware from the disk's own partitions: UEFI, GRUB's
	// command line, the root on the second partition, a q35 machine.
	res := sh(t, v, "test -d /sys/firmware/efi && echo efi; cat /proc/cmdline; awk '$2 == \"/\" {print $1}' /proc/mounts; cat /sys/class/dmi/id/product_name")
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if len(lines) != 4 || lines[0] != "efi" || !strings.Contains(lines[1], vm.BootDiskCmdline) ||
		lines[2] != "/dev/vda2" || !strings.Contains(lines[3], "Q35") {
		t.Fatalf("guest sees %q (stderr %q), want efi, the command line %q, root /dev/vda2, a Q35 machine", res.Stdout, res.Stderr, vm.BootDiskCmdline)
	}
	// The ESP is the first partition, 64 MiB (sizes in 512-byte sectors).
	if res := sh(t, v, "cat /sys/block/vda/vda1/start /sys/block/vda/vda1/size"); string(res.Stdout) != "2048\n131072\n" {
		t.Fatalf("ESP partition start/size: %q", res.Stdout)
	}

	data := []byte("written through guest-file-write\n")
	if n, err := c.WriteFile(ctx, "/workspace/bootdisk.txt", bytes.NewReader(data)); err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d %v", n, err)
	}
	if got, err := c.ReadFile(ctx, "/workspace/bootdisk.txt", 1<<10); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %q, %v", got, err)
	}

	// What a stock image has: qemu-ga alone. No sandbox-agent port, so
	// sandbox-init did not start the agent; the host has no agent socket.
	res = sh(t, v, "ls /dev/virtio-ports; ps -eo args")
	if !strings.Contains(string(res.Stdout), "org.qemu.guest_agent.0") || !strings.Contains(string(res.Stdout), "/usr/sbin/qemu-ga") {
		t.Fatalf("no qemu-ga port or process in %q", res.Stdout)
	}
	if strings.Contains(string(res.Stdout), "org.sandboxrunner.agent") || strings.Contains(string(res.Stdout), "/run/sandboxd/agent") {
		t.Fatalf("sandbox-agent port or process in a disk guest:\n%s", res.Stdout)
	}
	if _, err := os.Stat(filepath.Join(v.Dir(), "agent.sock")); !os.IsNotExist(err) {
		t.Fatalf("agent socket on the host for a disk guest: %v", err)
	}

	// The serial console shows the whole boot: GRUB, the kernel, init.
	console := v.Console(1 << 20)
	for _, want := range []string{"sandbox boot disk: loading the kernel", "Linux version " + g.Release, "sandbox-init: ready"} {
		if !strings.Contains(console, want) {
			t.Fatalf("console.log lacks %q:\n%s", want, v.Console(3000))
		}
	}
}
