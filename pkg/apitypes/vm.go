package apitypes

// VM types: the vm_* tools, /v1/vms and `sandboxctl vm`. A VM is a sandbox
// run by the VM backend (a QEMU guest with the same agent), so VM ids are
// sandbox ids and a VM has a sandbox's state machine.

// VMCreateRequest is the input of vm_create.
type VMCreateRequest struct {
	OS       string            `json:"os,omitempty" jsonschema_description:"Guest OS: linux (default) or windows (boots vm.images.windows; only the QEMU guest agent runs in it)." jsonschema:"enum=linux,enum=windows"`
	Image    string            `json:"image,omitempty" jsonschema_description:"Guest image: linux (the Linux test guest, default) or a language (python, ...) made into a guest (images build --vm LANGUAGE)."`
	MemoryMB *int64            `json:"memory_mb,omitempty" jsonschema_description:"Guest RAM in MiB (default 256; an administrator's disk: Windows 4096, Linux 1024; at most sandbox.max_memory)."`
	CPUs     *float64          `json:"cpus,omitempty" jsonschema_description:"Virtual CPUs (whole numbers, default 1, at most sandbox.max_cpus)."`
	Labels   map[string]string `json:"labels,omitempty" jsonschema_description:"Labels (key -> value) kept with the VM."`
	Env      map[string]string `json:"env,omitempty" jsonschema_description:"Environment variables of every command in the VM."`
}

// VM describes a VM: its sandbox record plus what only a VM has.
type VM struct {
	Sandbox
	OS string `json:"os"`
	// Accel is the accelerator QEMU runs the guest with: kvm or tcg
	// (software emulation); empty when the VM is not live.
	Accel string `json:"accel,omitempty"`
	// GuestAgent is what reaches the guest of a live VM: GuestAgentSandbox
	// (our guests: every sandbox operation works) or GuestAgentQGA (an
	// administrator's disk: vm_exec and vm_file_* through the QEMU guest
	// agent only).
	GuestAgent string   `json:"guest_agent,omitempty"`
	Snapshots  []string `json:"snapshots,omitempty"`
}

// VM.GuestAgent values.
const (
	GuestAgentSandbox = "sandbox-agent"
	GuestAgentQGA     = "qemu-ga"
)

// VMExecRequest is the input of vm_exec: exec_command's fields with vm_id.
type VMExecRequest struct {
	VMID           string            `json:"vm_id" jsonschema_description:"Id of a live VM (vm_create)."`
	Command        string            `json:"command,omitempty" jsonschema_description:"Shell command line, run with /bin/sh -c in the guest. Give command or argv."`
	Argv           []string          `json:"argv,omitempty" jsonschema_description:"Program and arguments, run without a shell. Give command or argv."`
	Cwd            string            `json:"cwd,omitempty" jsonschema_description:"Working directory (absolute; default /workspace)."`
	Env            map[string]string `json:"env,omitempty" jsonschema_description:"Extra environment variables."`
	Stdin          string            `json:"stdin,omitempty" jsonschema_description:"Text written to the command's standard input."`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty" jsonschema_description:"Kill the command after this many seconds."`
	MaxOutputBytes int64             `json:"-"`
}

// ExecRequest is the sandbox request a VM exec is.
func (r VMExecRequest) ExecRequest() ExecRequest {
	return ExecRequest{SandboxID: r.VMID, Command: r.Command, Argv: r.Argv, Cwd: r.Cwd, Env: r.Env,
		Stdin: r.Stdin, TimeoutSeconds: r.TimeoutSeconds, MaxOutputBytes: r.MaxOutputBytes}
}

// VMFileWriteRequest is the input of vm_file_write.
type VMFileWriteRequest struct {
	VMID     string `json:"vm_id" jsonschema_description:"Id of a live VM (vm_create)."`
	Path     string `json:"path" jsonschema_description:"Absolute path in the guest, normally under /workspace. Parent directories are created."`
	Content  string `json:"content" jsonschema_description:"The file's content: text, or base64 with encoding base64."`
	Encoding string `json:"encoding,omitempty" jsonschema_description:"utf-8 (default) or base64." jsonschema:"enum=utf-8,enum=base64"`
	Mode     string `json:"mode,omitempty" jsonschema_description:"Octal permission bits, default 0644."`
}

// VMFileReadRequest is the input of vm_file_read.
type VMFileReadRequest struct {
	VMID     string `json:"vm_id" jsonschema_description:"Id of a live VM (vm_create)."`
	Path     string `json:"path" jsonschema_description:"Absolute path of a file in the guest."`
	Encoding string `json:"encoding,omitempty" jsonschema_description:"utf-8 (default) or base64." jsonschema:"enum=utf-8,enum=base64"`
	Offset   int64  `json:"offset,omitempty" jsonschema_description:"Byte offset to start reading at."`
	MaxBytes int64  `json:"max_bytes,omitempty" jsonschema_description:"Most bytes to return."`
}

// VMSnapshotRequest is the input of vm_snapshot and vm_restore.
type VMSnapshotRequest struct {
	VMID string `json:"vm_id" jsonschema_description:"Id of a live VM (vm_create)."`
	Name string `json:"name" jsonschema_description:"Snapshot name: letters, digits, '.', '_' and '-' (not only digits)."`
}

// VMSnapshotResult is the outcome of vm_snapshot and vm_restore.
type VMSnapshotResult struct {
	VMID       string   `json:"vm_id"`
	Name       string   `json:"name"`
	Snapshots  []string `json:"snapshots"`
	DurationMS int64    `json:"duration_ms"`
}

// VMTestRequest is the input of vm_test: files copied into a clean VM,
// setup commands, then test commands, each a shell command line.
type VMTestRequest struct {
	OS       string            `json:"os,omitempty" jsonschema_description:"Guest OS: linux (default)." jsonschema:"enum=linux,enum=windows"`
	Image    string            `json:"image,omitempty" jsonschema_description:"Guest image: linux (default) or a language guest such as python (has pytest)."`
	MemoryMB *int64            `json:"memory_mb,omitempty" jsonschema_description:"Guest RAM in MiB."`
	CPUs     *float64          `json:"cpus,omitempty" jsonschema_description:"Virtual CPUs."`
	Files    map[string]string `json:"files,omitempty" jsonschema_description:"Files copied into /workspace first: path relative to /workspace -> content (text)."`
	Setup    []string          `json:"setup,omitempty" jsonschema_description:"Shell command lines run first, in order, in /workspace (e.g. installs)."`
	Test     []string          `json:"test" jsonschema_description:"Shell command lines of the tests, run in order after setup (e.g. python3 -m pytest -q). The first that fails ends the run."`
	Env      map[string]string `json:"env,omitempty" jsonschema_description:"Environment variables of every step."`
	// TimeoutSeconds bounds every step together (default: sandbox.exec_timeout).
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty" jsonschema_description:"Time limit of all steps together."`
	// Keep leaves the VM running afterwards (default: destroyed).
	Keep bool `json:"keep,omitempty" jsonschema_description:"Keep the VM after the test (default: destroy it)."`
}

// VMTestStep is the outcome of one vm_test step.
type VMTestStep struct {
	RunStep
	// Phase is setup or test; Command the shell command line.
	Phase   string `json:"phase"`
	Command string `json:"command"`
}

// VMTestResult is the outcome of vm_test.
type VMTestResult struct {
	VMID   string       `json:"vm_id"`
	RunID  string       `json:"run_id"`
	Passed bool         `json:"passed"`
	Steps  []VMTestStep `json:"steps"`
	// FailedStep is the index in Steps of the step that failed, or -1.
	FailedStep int `json:"failed_step"`
	// Screenshot is the guest's screen (PNG) when a step failed; also in
	// the run record as screenshot.png.
	Screenshot []byte `json:"screenshot_png,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	// Destroyed says the VM was destroyed afterwards (keep false).
	Destroyed bool `json:"destroyed"`
}
