package apitypes

// VM types. A VM is a sandbox whose backend is "vm" (sandbox_create
// {backend: "vm"}): its id is a sandbox_id, it has a sandbox's state
// machine, and the sandbox operations work on it as far as its
// capabilities go. What only a VM has is VMInfo, and vm_test.

// VMInfo is what only a VM has, in its sandbox's description.
type VMInfo struct {
	// OS is the guest OS: linux or windows.
	OS string `json:"os"`
	// Accel is the accelerator QEMU runs the guest with: kvm or tcg
	// (software emulation); empty when the VM is not live.
	Accel string `json:"accel,omitempty"`
	// GuestAgent is what reaches the guest of a live VM: GuestAgentSandbox
	// (our guests: every agent operation works) or GuestAgentQGA (an
	// administrator's disk: exec and files through the QEMU guest agent
	// only).
	GuestAgent string `json:"guest_agent,omitempty"`
	// Snapshots are the names of a live VM's machine snapshots
	// (sandbox_get only).
	Snapshots []string `json:"snapshots,omitempty"`
}

// VMInfo.GuestAgent values.
const (
	GuestAgentSandbox = "sandbox-agent"
	GuestAgentQGA     = "qemu-ga"
)

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
	// Keep leaves the VM running afterwards (default: terminated).
	Keep bool `json:"keep,omitempty" jsonschema_description:"Keep the VM after the test (default: terminate it)."`
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
	// SandboxID is the VM's (a sandbox id like any other).
	SandboxID string       `json:"sandbox_id"`
	RunID     string       `json:"run_id"`
	Passed    bool         `json:"passed"`
	Steps     []VMTestStep `json:"steps"`
	// FailedStep is the index in Steps of the step that failed, or -1.
	FailedStep int `json:"failed_step"`
	// Screenshot is the guest's screen (PNG) when a step failed; also in
	// the run record as screenshot.png.
	Screenshot []byte `json:"screenshot_png,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	// Destroyed says the VM was terminated afterwards (keep false).
	Destroyed bool `json:"destroyed"`
}

// ScreenshotResult describes sandbox_screenshot's picture (the PNG itself
// travels as an image content block, or as the body of GET
// /v1/sandboxes/{id}/screenshot).
type ScreenshotResult struct {
	SandboxID string `json:"sandbox_id"`
	MIMEType  string `json:"mime_type"`
	SizeBytes int    `json:"size_bytes"`
}
