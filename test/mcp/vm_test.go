package mcp

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/vmenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/vm"
)

// vmReport is what client.mjs's vm and vmqga modes saw.
type vmReport struct {
	Tools   []string `json:"tools"`
	Created struct {
		ID           string   `json:"sandbox_id"`
		State        string   `json:"state"`
		Backend      string   `json:"backend"`
		Image        string   `json:"image"`
		Capabilities []string `json:"capabilities"`
		VM           struct {
			OS         string `json:"os"`
			Accel      string `json:"accel"`
			GuestAgent string `json:"guest_agent"`
		} `json:"vm"`
	} `json:"created"`
	CreateProgress []string `json:"create_progress"`
	Exec           struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	} `json:"exec"`
	Write struct {
		Path string `json:"path"`
		Size int    `json:"size"`
	} `json:"write"`
	Read struct {
		Content string `json:"content"`
	} `json:"read"`
	Snapshot struct {
		ID        string `json:"snapshot_id"`
		Name      string `json:"name"`
		Kind      string `json:"kind"`
		SandboxID string `json:"sandbox_id"`
	} `json:"snapshot"`
	BeforeRestore struct {
		Stdout string `json:"stdout"`
	} `json:"before_restore"`
	Restore struct {
		State string `json:"state"`
	} `json:"restore"`
	AfterRestore struct {
		Stdout string `json:"stdout"`
	} `json:"after_restore"`
	Get struct {
		VM struct {
			Snapshots []string `json:"snapshots"`
		} `json:"vm"`
	} `json:"get"`
	Screenshot struct {
		IsError    bool `json:"isError"`
		Structured struct {
			SandboxID string `json:"sandbox_id"`
			MIMEType  string `json:"mime_type"`
			SizeBytes int    `json:"size_bytes"`
		} `json:"structured"`
		Images []struct {
			MIMEType string `json:"mimeType"`
			Bytes    int    `json:"bytes"`
			PNG      bool   `json:"png"`
		} `json:"images"`
	} `json:"screenshot"`
	Terminate struct {
		State string `json:"state"`
	} `json:"terminate"`
	AfterTerminate errResult `json:"after_terminate"`
	Errors         []string  `json:"errors"`
}

// checkVMCommon asserts what both guests must have done alike; os is the
// guest's, uid its exec user's, agent its guest agent.
func checkVMCommon(t *testing.T, r *vmReport, uid, agent string, caps []string) {
	t.Helper()
	c := r.Created
	if c.ID == "" || c.State != "ready" || c.Backend != "vm" || c.VM.OS != "linux" || c.VM.Accel == "" || c.VM.GuestAgent != agent || !slices.Equal(c.Capabilities, caps) {
		t.Errorf("sandbox_create {backend: vm}: %+v", c)
	}
	if r.Exec.ExitCode != 3 || r.Exec.Stdout != "Linux\n"+uid+"\n" || r.Exec.Stderr != "err\n" {
		t.Errorf("exec_command on the VM: %+v", r.Exec)
	}
	if r.Write.Size != len("hello from the SDK\n") || r.Read.Content != "hello from the SDK\n" {
		t.Errorf("file_write/file_read on the VM: %+v %+v", r.Write, r.Read)
	}
	if r.Snapshot.Kind != "memory" || r.Snapshot.Name != "clean" || len(r.Snapshot.ID) != 64 || r.Snapshot.SandboxID != c.ID {
		t.Errorf("sandbox_snapshot of the VM: %+v", r.Snapshot)
	}
	if r.BeforeRestore.Stdout != "a.txt\nlater.txt\n" || r.AfterRestore.Stdout != "a.txt\n" || r.Restore.State != "ready" {
		t.Errorf("sandbox_restore of the VM: before %q, after %q, state %q", r.BeforeRestore.Stdout, r.AfterRestore.Stdout, r.Restore.State)
	}
	if !slices.Contains(r.Get.VM.Snapshots, "clean") {
		t.Errorf("sandbox_get's VM snapshots: %v", r.Get.VM.Snapshots)
	}
	s := r.Screenshot
	if s.IsError || s.Structured.SandboxID != c.ID || s.Structured.MIMEType != "image/png" || len(s.Images) != 1 ||
		!s.Images[0].PNG || s.Images[0].Bytes != s.Structured.SizeBytes || s.Images[0].MIMEType != "image/png" {
		t.Errorf("sandbox_screenshot of the VM: %+v", s)
	}
	if r.Terminate.State != "terminated" || !r.AfterTerminate.IsError || !strings.Contains(r.AfterTerminate.Text, "conflict") {
		t.Errorf("sandbox_terminate: %+v, exec after: %+v", r.Terminate, r.AfterTerminate)
	}
	if len(r.Errors) != 0 {
		t.Errorf("client errors: %v", r.Errors)
	}
}

// refused asserts an unavailable error naming the sandbox and capability.
func refused(t *testing.T, what string, e errResult, id, capability string) {
	t.Helper()
	if !e.IsError || !strings.Contains(e.Text, `"unavailable"`) || !strings.Contains(e.Text, id) || !strings.Contains(e.Text, capability+" capability") {
		t.Errorf("%s: want unavailable naming %s and the %s capability, got %+v", what, id, capability, e)
	}
}

// TestVMThroughSDK: a VM of the Linux test guest, under TCG, through the
// official TypeScript SDK with the ordinary sandbox tools: sandbox_create
// {backend: vm}, exec_command, file_write/file_read/file_list, a job,
// sandbox_snapshot then sandbox_restore, sandbox_screenshot,
// sandbox_terminate. The SDK checks every structured result against its
// tool's output schema.
func TestVMThroughSDK(t *testing.T) {
	testenv.RequireRoot(t)
	vmenv.Guest(t) // the Linux test guest, in the shared image cache
	d := newDaemon(t, func(c *config.Config) { c.VM.MaxVMs = 1; c.VM.Accel = vm.AccelTCG })
	var r struct {
		vmReport
		List struct {
			Entries []struct {
				Path string `json:"path"`
			} `json:"entries"`
		} `json:"list"`
		Job struct {
			State    string `json:"state"`
			ExitCode *int   `json:"exit_code"`
			Stdout   string `json:"stdout"`
		} `json:"job"`
		Pause       struct{ State string }  `json:"pause"`
		PausedExec  errResult               `json:"paused_exec"`
		Resume      struct{ State string }  `json:"resume"`
		ResumedExec struct{ Stdout string } `json:"resumed_exec"`
	}
	runClient(t, "vm", httpTransport(d), 0, &r)
	checkVMCommon(t, &r.vmReport, "1000", "sandbox-agent", []string{"exec", "jobs", "pty", "files", "file_list", "ports", "memory_snapshot", "screenshot", "pause"})
	if r.Pause.State != "paused" || !r.PausedExec.IsError || !strings.Contains(r.PausedExec.Text, "conflict") || r.Resume.State != "ready" || r.ResumedExec.Stdout != "hello from the SDK\n" {
		t.Errorf("pause and resume of the VM: %+v %+v %+v %+v", r.Pause, r.PausedExec, r.Resume, r.ResumedExec)
	}
	if !slices.Equal(r.Tools, wantTools) {
		t.Errorf("tools = %v\nwant %v", r.Tools, wantTools)
	}
	if len(r.List.Entries) != 1 || r.List.Entries[0].Path != "/workspace/notes/a.txt" {
		t.Errorf("file_list on the VM: %+v", r.List)
	}
	if r.Job.State != "finished" || r.Job.ExitCode == nil || *r.Job.ExitCode != 4 || r.Job.Stdout != "job\n" {
		t.Errorf("a job on the VM: %+v", r.Job)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

// TestQGAVMThroughSDK: a VM of an administrator's Linux disk
// (vm.images.linux: the Linux test guest made into a UEFI boot disk that
// runs only Debian's qemu-ga), under TCG, through the TypeScript SDK: the
// same tools where qemu-ga is capable (exec, files, machine snapshots, the
// screen), and an unavailable error naming the sandbox and the missing
// capability where not (file_list, jobs, ports, pause).
func TestQGAVMThroughSDK(t *testing.T) {
	testenv.RequireRoot(t)
	disk := filepath.Join(t.TempDir(), "admin-linux.qcow2")
	if err := vm.MakeBootDisk(context.Background(), vmenv.Guest(t), disk); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, func(c *config.Config) {
		c.VM.MaxVMs = 1
		c.VM.Accel = vm.AccelTCG
		c.VM.Images = map[string]string{vm.OSLinux: disk}
	})
	var r struct {
		vmReport
		List   errResult `json:"list"`
		Job    errResult `json:"job"`
		Expose errResult `json:"expose"`
		Pause  errResult `json:"pause"`
	}
	runClient(t, "vmqga", httpTransport(d), 0, &r)
	checkVMCommon(t, &r.vmReport, "0", "qemu-ga", []string{"exec", "files", "memory_snapshot", "screenshot"})
	if r.Created.Image != disk || len(r.CreateProgress) == 0 || !strings.HasPrefix(r.CreateProgress[0], "booting linux from "+disk) {
		t.Errorf("the disk guest's create: image %q, progress %q", r.Created.Image, r.CreateProgress)
	}
	refused(t, "file_list", r.List, r.Created.ID, "file_list")
	refused(t, "a background job", r.Job, r.Created.ID, "jobs")
	refused(t, "sandbox_expose_port", r.Expose, r.Created.ID, "ports")
	refused(t, "sandbox_pause", r.Pause, r.Created.ID, "pause")
	if !strings.Contains(r.Job.Text, "only the QEMU guest agent") {
		t.Errorf("the refusal does not say why: %s", r.Job.Text)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}
