package vm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

func TestResolveProfile(t *testing.T) {
	cfg := config.Default().VM
	_, err := ResolveProfile(&cfg, OSWindows)
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "vm.images.windows") {
		t.Fatalf("windows without image: %v", err)
	}
	cfg.Images = map[string]string{OSWindows: "/nonexistent/win.qcow2"}
	if _, err := ResolveProfile(&cfg, OSWindows); !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "vm.images.windows") {
		t.Fatalf("windows with missing image: %v", err)
	}
	img := filepath.Join(t.TempDir(), "win.qcow2")
	os.WriteFile(img, []byte("x"), 0o600)
	cfg.Images[OSWindows] = img
	p, err := ResolveProfile(&cfg, OSWindows)
	if err != nil || !p.TPM || p.Firmware == nil || !p.Firmware.SecureBoot || p.MinMemoryMiB < 4096 || p.Disk != img {
		t.Fatalf("windows profile: %+v %v", p, err)
	}
	if p, err := ResolveProfile(&cfg, OSLinux); err != nil || p.Disk != "" || p.TPM || p.QGAOnly() || p.Firmware != nil {
		t.Fatalf("linux profile: %+v %v", p, err)
	}
	// An administrator's Linux disk: UEFI without Secure Boot, no TPM.
	cfg.Images[OSLinux] = "/nonexistent/linux.qcow2"
	if _, err := ResolveProfile(&cfg, OSLinux); !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(err.Error(), "vm.images.linux") {
		t.Fatalf("linux with a missing disk: %v", err)
	}
	cfg.Images[OSLinux] = img
	if p, err := ResolveProfile(&cfg, OSLinux); err != nil || p.Disk != img || !p.QGAOnly() || p.TPM || p.Firmware == nil || p.Firmware.SecureBoot || p.Firmware.Code != OVMFCode {
		t.Fatalf("linux disk profile: %+v %v", p, err)
	}
	if _, err := ResolveProfile(&cfg, "plan9"); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "os:") {
		t.Fatalf("unknown os: %v", err)
	}
}

func TestSpecValidate(t *testing.T) {
	g := &Guest{Kernel: "/k", Initrd: "/i", Disk: "/d"}
	for _, tc := range []struct {
		name  string
		spec  Spec
		field string
	}{
		{"id", Spec{ID: "Bad/ID", Dir: "/run/x", Guest: g}, "id:"},
		{"guest", Spec{ID: "a", Dir: "/run/x"}, "guest:"},
		{"relative dir", Spec{ID: "a", Dir: "run/x", Guest: g}, "dir:"},
		{"long dir", Spec{ID: "a", Dir: "/run/" + strings.Repeat("x", 100), Guest: g}, "dir:"},
		{"memory", Spec{ID: "a", Dir: "/run/x", Guest: g, MemoryMiB: 64}, "memory_mib:"},
		{"cpus", Spec{ID: "a", Dir: "/run/x", Guest: g, CPUs: 65}, "cpus:"},
		{"accel", Spec{ID: "a", Dir: "/run/x", Guest: g, Accel: "hvf"}, "accel:"},
		{"kernel args", Spec{ID: "a", Dir: "/run/x", Guest: g, KernelArgs: "a\nb"}, "kernel_args:"},
		{"relative data disk", Spec{ID: "a", Dir: "/run/x", Guest: g, DataDisks: []string{"d.raw"}}, "data_disks[0]:"},
		{"data disk with comma", Spec{ID: "a", Dir: "/run/x", Guest: g, DataDisks: []string{"/d.raw", "/a,b"}}, "data_disks[1]:"},
	} {
		err := tc.spec.validate()
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want invalid_argument naming %s", tc.name, err, tc.field)
		}
	}
	s := Spec{ID: "a", Dir: "/run/x", Guest: g}
	if err := s.validate(); err != nil || s.MemoryMiB != DefaultMemoryMiB || s.CPUs != DefaultCPUs || s.QEMU != DefaultQEMU {
		t.Fatalf("defaults: %+v %v", s, err)
	}
}

func TestArgs(t *testing.T) {
	g := &Guest{Kernel: "/k", Initrd: "/i", Disk: "/d"}
	s := Spec{ID: "a", Dir: "/run/x", Guest: g, Accel: AccelTCG, MemoryMiB: 256, CPUs: 1}
	a := strings.Join(s.args(), " ")
	for _, want := range []string{"-accel tcg,tb-size=64", "-cpu max", "-m 256", "-nodefaults", "-no-reboot",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-qmp unix:/run/x/qmp.sock,server=on,wait=off", "path=/run/x/console.log", "-kernel /k",
		"path=/run/x/agent.sock,server=on,wait=off", "name=org.sandboxrunner.agent.0"} {
		if !strings.Contains(a, want) {
			t.Errorf("args lack %q: %s", want, a)
		}
	}
	if strings.Contains(a, "-loadvm") || strings.Contains(a, "pflash") || strings.Contains(a, "tpm") || strings.Contains(a, "-runas") ||
		strings.Contains(a, "disk1") {
		t.Errorf("unexpected options: %s", a)
	}
	// Data disks follow the root disk as raw virtio-blk devices.
	s.DataDisks = []string{"/data.raw"}
	a = strings.Join(s.args(), " ")
	if want := "-blockdev driver=file,filename=/data.raw,node-name=file1 -blockdev driver=raw,file=file1,node-name=disk1 -device virtio-blk-pci,drive=disk1"; !strings.Contains(a, want) ||
		strings.Index(a, want) < strings.Index(a, "drive=disk0") {
		t.Errorf("args lack %q after the root disk: %s", want, a)
	}
	s.DataDisks = nil
	s.Accel, s.RunAs, s.FromTemplate, s.TPM = AccelKVM, "nobody", "/t.qcow2", true
	s.Firmware = &Firmware{Code: "/c", Vars: "/v", SecureBoot: true}
	s.Guest = DiskGuest(OSWindows, "/w.qcow2")
	a = strings.Join(s.args(), " ")
	for _, want := range []string{"-accel kvm", "-cpu host", "-loadvm ready", "-runas nobody", "elevateprivileges=allow",
		"q35,smm=on", "property=secure,value=on", "unit=0,readonly=on,file=/c", "format=qcow2,unit=1,file=/run/x/vars.qcow2",
		"-tpmdev emulator,id=tpm0,chardev=chrtpm"} {
		if !strings.Contains(a, want) {
			t.Errorf("args lack %q: %s", want, a)
		}
	}
	if strings.Contains(a, "-kernel") {
		t.Errorf("disk guest booted with -kernel: %s", a)
	}
	// A disk guest runs only qemu-ga: no sandbox-agent port, and it may
	// reboot.
	if strings.Contains(a, "org.sandboxrunner.agent") || strings.Contains(a, "-no-reboot") || !strings.Contains(a, "name=org.qemu.guest_agent.0") {
		t.Errorf("disk guest: want only the guest agent's port and no -no-reboot: %s", a)
	}
}

func TestSnapshotName(t *testing.T) {
	for _, ok := range []string{"clean", "v1.2", "a_b-c"} {
		if err := CheckSnapshotName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", "a b", "-x", "x;quit", strings.Repeat("a", 64)} {
		if err := CheckSnapshotName(bad); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

func TestModuleOrder(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/virtio/virtio_pci_modern_dev.ko:\n" +
		"kernel/drivers/virtio/virtio_ring.ko:\n" +
		"kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n" +
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n"
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	got, err := moduleOrder(dir, []string{"virtio_pci", "virtio_blk"})
	if err != nil {
		t.Fatal(err)
	}
	idx := func(m string) int { return slices.Index(got, "kernel/drivers/virtio/"+m+".ko") }
	if len(got) != 5 || idx("virtio_ring") > idx("virtio") || idx("virtio") > idx("virtio_pci") || got[4] != "kernel/drivers/block/virtio_blk.ko" {
		t.Fatalf("order %v", got)
	}
	if _, err := moduleOrder(dir, []string{"virtio_console"}); err == nil || !strings.Contains(err.Error(), "virtio_console") {
		t.Fatalf("missing module: %v", err)
	}
}

func TestContentionOf(t *testing.T) {
	for _, c := range []struct {
		loadavg string
		cpus    int
		want    float64
	}{
		{"0.50 0.40 0.30 1/300 1234", 2, 1},      // idle: at least 1
		{"120.00 80.00 40.00 3/900 1234", 2, 60}, // saturated, by the average
		{"1.00 1.00 1.00 41/900 1234", 2, 20},    // a burst the average has not seen yet
		{"garbage", 2, 1},
	} {
		if got := contentionOf(c.loadavg, c.cpus); got != c.want {
			t.Errorf("contentionOf(%q, %d) = %v, want %v", c.loadavg, c.cpus, got, c.want)
		}
	}
}

func TestBootBudget(t *testing.T) {
	boots.mu.Lock()
	saved := boots.last
	boots.last = nil
	boots.mu.Unlock()
	t.Cleanup(func() { boots.mu.Lock(); boots.last = saved; boots.mu.Unlock() })

	// Nothing measured: the nominal boot, slack, scaled by the contention,
	// within the bounds.
	if got := bootBudget(AccelTCG, 1); got != minBootBudget {
		t.Errorf("idle, unmeasured: %v, want the floor %v", got, minBootBudget)
	}
	if got := bootBudget(AccelTCG, 5); got != 5*bootSlack*nominalBoot[AccelTCG] {
		t.Errorf("contention 5, unmeasured: %v", got)
	}
	if got := bootBudget("", 1000); got != maxBootBudget {
		t.Errorf("contention 1000: %v, want the cap %v", got, maxBootBudget)
	}
	// A measured boot of 30 s at contention 2: at contention 4 the budget is
	// slack x 30 s x 2.
	observeBoot(AccelTCG, 30*time.Second, 2)
	if got := bootBudget(AccelTCG, 4); got != bootSlack*60*time.Second {
		t.Errorf("measured 30 s at 2, now 4: %v, want %v", got, bootSlack*60*time.Second)
	}
	// KVM has its own reference.
	if got := bootBudget(AccelKVM, 1); got != minBootBudget {
		t.Errorf("kvm: %v", got)
	}
}
