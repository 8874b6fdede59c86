package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// The vm tool group: VMs (QEMU guests running the same agent as
// containers) through the engine's VM operations.

type vmIDIn struct {
	VMID string `json:"vm_id" jsonschema_description:"Id of a VM (vm_create)."`
}

type vmListIn struct {
	State string `json:"state,omitempty" jsonschema_description:"Only VMs in this state: creating, ready, running, terminated, failed or all. Default: live ones."`
}

type vmListOut struct {
	VMs []*apitypes.VM `json:"vms"`
}

type vmScreenshotOut struct {
	VMID      string `json:"vm_id"`
	MIMEType  string `json:"mime_type"`
	SizeBytes int    `json:"size_bytes"`
}

// vmTestOut is vm_test's outcome; the screenshot travels as an image
// content block, not base64 in the structured content.
type vmTestOut struct {
	apitypes.VMTestResult
	Screenshot    []byte `json:"-"`
	HasScreenshot bool   `json:"has_screenshot"`
	Note          string `json:"note,omitempty"`
}

func vmText(v *apitypes.VM) string {
	s := fmt.Sprintf("vm %s: %s, image %s, %d MiB, %v vCPU", v.ID, v.State, v.Image, v.Limits.MemoryBytes>>20, v.Limits.CPUs)
	if v.Accel != "" {
		s += ", accel " + v.Accel
	}
	if len(v.Snapshots) > 0 {
		s += ", snapshots " + strings.Join(v.Snapshots, " ")
	}
	return s
}

func (s *srv) addVMTools() {
	addTool[apitypes.VMCreateRequest, apitypes.VM](s, "vm_create", "Create a VM",
		joinLines(
			"Start a virtual machine (QEMU) and return its vm_id once its agent answers. A VM is slower than a sandbox (seconds from a saved snapshot, tens of seconds the first time) but has its own kernel: use it for code that needs a real kernel or is too dangerous for a container.",
			"os: linux (default). image: linux (a minimal Debian guest with python3) or a language (python has pytest). The guest has user 1000, a writable /workspace and /tmp, and no network. windows needs an administrator-prepared image (vm.images.windows).",
			"An administrator's disk (os windows, or linux when vm.images.linux is set and image is empty or linux) boots for seconds to minutes and runs only the QEMU guest agent (guest_agent: qemu-ga in the result): vm_exec, vm_file_* (as root/SYSTEM, absolute paths) and vm_test work, the sandbox tools do not.",
			fmt.Sprintf("Limits: at most %d VMs at once; memory_mb up to %s.", s.cfg.VM.MaxVMs, s.cfg.Sandbox.MaxMemory),
		),
		annotations{},
		func(ctx context.Context, c *call, in *apitypes.VMCreateRequest) (*result, error) {
			req := *in
			req.Labels = c.withSessionLabel(in.Labels)
			var progress func(string)
			if out := c.progress.outputFunc(); out != nil {
				// A first use builds the guest image (minutes): its
				// phase and log lines, one notification each.
				progress = func(line string) { out("stdout", []byte(line+"\n")) }
			}
			v, err := s.e.CreateVM(ctx, req, progress)
			if err != nil {
				return nil, err
			}
			return &result{structured: v, text: vmText(v)}, nil
		})

	addTool[vmListIn, vmListOut](s, "vm_list", "List VMs",
		"List VMs (live ones unless state says otherwise): id, state, image, limits, accelerator.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *vmListIn) (*result, error) {
			vms, err := s.e.ListVMs(ctx, in.State)
			if err != nil {
				return nil, err
			}
			var b strings.Builder
			for _, v := range vms {
				b.WriteString(vmText(v) + "\n")
			}
			if len(vms) == 0 {
				b.WriteString("no VMs")
			}
			return &result{structured: vmListOut{VMs: vms}, text: b.String()}, nil
		})

	addTool[vmIDIn, apitypes.VM](s, "vm_get", "Describe a VM",
		"Describe a VM: state, image, limits, accelerator (kvm or tcg) and its snapshots.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *vmIDIn) (*result, error) {
			v, err := s.e.GetVM(ctx, in.VMID)
			if err != nil {
				return nil, err
			}
			return &result{structured: v, text: vmText(v)}, nil
		})

	addTool[vmIDIn, apitypes.VM](s, "vm_destroy", "Destroy a VM",
		"Stop a VM and delete it: its QEMU process, disk overlay, snapshots and sockets. Destroying a destroyed VM is a no-op.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *vmIDIn) (*result, error) {
			v, err := s.e.DestroyVM(ctx, in.VMID)
			if err != nil {
				return nil, err
			}
			return &result{structured: v, text: fmt.Sprintf("vm %s is %s", v.ID, v.State)}, nil
		})

	addTool[apitypes.VMExecRequest, execOut](s, "vm_exec", "Run a command in a VM",
		joinLines(
			"Run a command in a VM and wait for it, like exec_command: command (a shell line) or argv; exit_code, stdout, stderr, duration, termination.",
			fmt.Sprintf("Prerequisite: a live vm_id from vm_create. Runs in /workspace as user 1000. Limits: %s.", s.limits()),
			"On a guest with only the QEMU guest agent (guest_agent qemu-ga): runs as root (Windows: SYSTEM; command under cmd.exe, output in UTF-8), cwd absolute (Windows: with command only), output at the end.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.VMExecRequest) (*result, error) {
			res, err := s.e.VMExec(ctx, *in, c.progress.outputFunc())
			if err != nil {
				return nil, err
			}
			return s.execResult(res, "the full output is not kept: redirect it to a file in the VM and read that with vm_file_read"), nil
		})

	addTool[apitypes.VMFileWriteRequest, fileOut](s, "vm_file_write", "Write a file in a VM",
		"Write a file in a VM (parents created); content as text, or base64 with encoding base64. Prerequisite: a live vm_id. On a qemu-ga guest the path is absolute in its OS (C:\\... on Windows).",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.VMFileWriteRequest) (*result, error) {
			res, err := s.e.VMWriteFile(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: *res, text: fmt.Sprintf("wrote %s (%d bytes)", res.Path, res.Size)}, nil
		})

	addTool[apitypes.VMFileReadRequest, fileReadOut](s, "vm_file_read", "Read a file in a VM",
		"Read a file in a VM. A file larger than one tool result is returned in pages: truncated is true and next_offset is where to continue (pass it as offset).",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.VMFileReadRequest) (*result, error) {
			fr := &fileReadIn{SandboxID: in.VMID, Path: in.Path, Encoding: in.Encoding, Offset: in.Offset, MaxBytes: in.MaxBytes}
			return s.readFilePaged(ctx, fr, func(ctx context.Context, r apitypes.FileReadRequest) (*apitypes.FileReadResult, error) {
				return s.e.VMReadFile(ctx, apitypes.VMFileReadRequest{VMID: r.SandboxID, Path: r.Path, Encoding: r.Encoding, Offset: r.Offset, MaxBytes: r.MaxBytes})
			})
		})

	addTool[apitypes.VMSnapshotRequest, apitypes.VMSnapshotResult](s, "vm_snapshot", "Snapshot a VM",
		"Save a running VM's whole state (memory, devices, disk) under a name; vm_restore returns to it. The guest pauses for about a second. A snapshot of the same name is replaced.",
		annotations{idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.VMSnapshotRequest) (*result, error) {
			res, err := s.e.SnapshotVM(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: res, text: fmt.Sprintf("vm %s: snapshot %s saved in %d ms (snapshots: %s)", res.VMID, res.Name, res.DurationMS, strings.Join(res.Snapshots, " "))}, nil
		})

	addTool[apitypes.VMSnapshotRequest, apitypes.VMSnapshotResult](s, "vm_restore", "Restore a VM snapshot",
		"Return a running VM to a snapshot taken with vm_snapshot: files written and processes started since are gone.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.VMSnapshotRequest) (*result, error) {
			res, err := s.e.RestoreVM(ctx, *in)
			if err != nil {
				return nil, err
			}
			return &result{structured: res, text: fmt.Sprintf("vm %s: restored snapshot %s in %d ms", res.VMID, res.Name, res.DurationMS)}, nil
		})

	addTool[vmIDIn, vmScreenshotOut](s, "vm_screenshot", "Screenshot a VM",
		"Take a screenshot of a running VM's display (its text console, or the desktop of a graphical guest): returned as a PNG image content block. Prerequisite: a live vm_id.",
		annotations{readOnly: true},
		func(ctx context.Context, c *call, in *vmIDIn) (*result, error) {
			png, err := s.e.ScreenshotVM(ctx, in.VMID)
			if err != nil {
				return nil, err
			}
			out := vmScreenshotOut{VMID: in.VMID, MIMEType: "image/png", SizeBytes: len(png)}
			return &result{structured: out, text: fmt.Sprintf("screenshot of vm %s (%d bytes PNG)", in.VMID, len(png)),
				extra: []mcp.Content{mcp.NewImageContent(base64.StdEncoding.EncodeToString(png), "image/png")}}, nil
		})

	addTool[apitypes.VMTestRequest, vmTestOut](s, "vm_test", "Test a project in a clean VM",
		joinLines(
			"Copy files into a clean VM, run the setup commands and then the test commands (shell lines, in /workspace, in order; the first that fails ends the run), and destroy the VM. Returns passed, every step (phase, command, exit_code, stdout, stderr, duration), the index of the failed step, a run_id (run_get) and, when a step failed, a screenshot of the VM (an image).",
			"image python has pytest: e.g. {image: python, files: {...}, test: [\"python3 -m pytest -q\"]}.",
		),
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.VMTestRequest) (*result, error) {
			res, err := s.e.VMTest(ctx, *in)
			if err != nil {
				return nil, err
			}
			png := res.Screenshot
			res.Screenshot = nil
			r := s.fit(func(limit int) *result {
				out := vmTestOut{VMTestResult: *res, HasScreenshot: len(png) > 0}
				out.Steps = make([]apitypes.VMTestStep, len(res.Steps))
				per := limit / (2*len(res.Steps) + 1)
				cutAny := false
				var text strings.Builder
				fmt.Fprintf(&text, "vm_test in vm %s: passed %v (run %s)\n", res.VMID, res.Passed, res.RunID)
				for i, st := range res.Steps {
					var c1, c2 bool
					st.Stdout, c1 = cut(st.Stdout, per, "the run record keeps it (run_get)")
					st.Stderr, c2 = cut(st.Stderr, per, "the run record keeps it (run_get)")
					cutAny = cutAny || c1 || c2
					out.Steps[i] = st
					fmt.Fprintf(&text, "%s %q: exit %d (%s)\n", st.Phase, st.Command, st.ExitCode, st.Termination.Cause)
				}
				if cutAny {
					out.Note = "output was cut; run_get " + res.RunID + " has all of it"
				}
				return &result{structured: out, text: text.String()}
			})
			if len(png) > 0 {
				r.extra = []mcp.Content{mcp.NewImageContent(base64.StdEncoding.EncodeToString(png), "image/png")}
			}
			return r, nil
		})
}

// withSessionLabel returns labels plus the MCP session's label, so that
// what a session creates (sandboxes, VMs) ends with it under
// server.mcp_on_session_end: terminate.
func (c *call) withSessionLabel(labels map[string]string) map[string]string {
	out := maps.Clone(labels)
	if c.session != "" {
		if out == nil {
			out = map[string]string{}
		}
		out[SessionLabel] = c.session
	}
	return out
}
