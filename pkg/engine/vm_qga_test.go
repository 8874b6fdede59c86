package engine

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// vmRecord is the part of a VM's vm.json the tests read.
type vmRecord struct {
	PID    int      `json:"pid"`
	TPMPID int      `json:"tpm_pid"`
	Args   []string `json:"args"`
}

// watchVMRecord returns the vm.json of the first VM that appears under
// runDir/vms while a call runs (a VM whose start fails leaves none
// behind), and a function that stops watching and returns it.
func watchVMRecord(runDir string) func() *vmRecord {
	var mu sync.Mutex
	var rec *vmRecord
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			files, _ := filepath.Glob(filepath.Join(runDir, "vms", "sb-*", "vm.json"))
			for _, f := range files {
				var r vmRecord
				if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil && r.PID != 0 {
					mu.Lock()
					if rec == nil {
						rec = &r
					}
					mu.Unlock()
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() *vmRecord {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return rec
	}
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// TestVMWindowsNeverReady: sandbox_create {backend: vm, os: windows} with vm.images.windows
// pointing at a disk that is no Windows (an empty qcow2) starts QEMU with
// the Windows machine (q35 with SMM, OVMF's Secure Boot code and per-VM
// variables, a swtpm TPM 2.0, no sandbox-agent port), the guest never
// answers, and the create fails at vm.boot_timeout with a clear error;
// nothing is left (QEMU, swtpm, state dir, cgroup, ledger rows). Before
// any boot, the Windows profile's minimums are taxonomy errors.
func TestVMWindowsNeverReady(t *testing.T) {
	requireRoot(t)
	disk := filepath.Join(t.TempDir(), "not-windows.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	env := newTestEngine(t, func(c *config.Config) {
		c.VM.MaxVMs = 1
		c.VM.Images = map[string]string{vm.OSWindows: disk}
		c.VM.BootTimeout = config.Duration(15 * time.Second)
	})
	ctx := context.Background()
	small, one := int64(1024), 1.0
	for name, c := range map[string]struct {
		req   CreateSandboxRequest
		field string
	}{
		"memory below windows' minimum": {CreateSandboxRequest{OS: "windows", MemoryMB: &small}, "memory_mb:"},
		"one vcpu":                      {CreateSandboxRequest{OS: "windows", CPUs: &one}, "cpus:"},
		"a language image":              {CreateSandboxRequest{OS: "windows", Image: "python"}, "image:"},
		"env with a quote":              {CreateSandboxRequest{OS: "windows", Env: map[string]string{"K": `"`}}, "env.K:"},
	} {
		c.req.Backend = BackendVM
		if _, err := env.CreateSandbox(ctx, c.req); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got %v, want invalid_argument naming %s", name, err, c.field)
		}
	}

	stop := watchVMRecord(env.cfg.Paths.RunDir)
	var progress []string
	t0 := time.Now()
	_, err := env.CreateSandboxProgress(ctx, CreateSandboxRequest{Backend: BackendVM, OS: "windows"}, func(l string) { progress = append(progress, l) })
	rec := stop()
	t.Logf("create failed after %v: %v", time.Since(t0), err)
	if !errdefs.Is(err, errdefs.Unavailable) || !strings.Contains(errdefs.MessageOf(err), "vm.boot_timeout") ||
		!strings.Contains(errdefs.MessageOf(err), "15s") || !strings.Contains(errdefs.MessageOf(err), "console:") {
		t.Errorf("create of a guest that never answers: %v", err)
	}
	if len(progress) != 1 || !strings.Contains(progress[0], "booting windows from "+disk) {
		t.Errorf("progress: %q", progress)
	}
	if rec == nil {
		t.Fatal("no vm.json seen while the VM booted")
	}
	args := strings.Join(rec.Args, " ")
	for _, want := range []string{"-machine q35,smm=on", "file=" + vm.OVMFSecureCode, "property=secure,value=on",
		"unit=1,file=", "-tpmdev emulator,id=tpm0", "-device tpm-tis", "-m 4096", "-smp 2", "name=org.qemu.guest_agent.0"} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu argv lacks %q: %s", want, args)
		}
	}
	for _, unwanted := range []string{"-kernel", "org.sandboxrunner.agent", "-no-reboot", "-loadvm"} {
		if strings.Contains(args, unwanted) {
			t.Errorf("qemu argv of a Windows disk guest has %q: %s", unwanted, args)
		}
	}
	if rec.TPMPID == 0 {
		t.Errorf("no swtpm in vm.json")
	}
	for what, pid := range map[string]int{"qemu": rec.PID, "swtpm": rec.TPMPID} {
		if pidAlive(pid) {
			t.Errorf("%s pid %d still runs after the failed create", what, pid)
		}
	}
	if dirs, _ := filepath.Glob(filepath.Join(env.cfg.Paths.RunDir, "vms", "sb-*")); len(dirs) > 0 {
		t.Errorf("VM state dirs left: %v", dirs)
	}
	if owners, err := env.ledger.Owners(ctx); err != nil || len(owners) > 0 {
		t.Errorf("ledger rows left: %v %v", owners, err)
	}
	failed := listVMs(t, env, string(sandbox.StateFailed))
	if len(failed) != 1 || failed[0].VM == nil || failed[0].VM.OS != vm.OSWindows || failed[0].Image != disk || !strings.Contains(failed[0].Reason, "vm.boot_timeout") {
		t.Errorf("the failed VM's record: %+v", failed)
	}
	if l := listVMs(t, env, ""); len(l) != 0 {
		t.Errorf("live VMs: %+v", l)
	}
	for _, f := range failed {
		for _, cg := range testenv.CgroupDirs(env.cfg.Sandbox.CgroupParent + "/vms/" + f.ID) {
			if _, err := os.Stat(cg); err == nil {
				t.Errorf("VM cgroup %s left", cg)
			}
		}
	}
}
