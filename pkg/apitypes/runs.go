package apitypes

import "time"

// The objects of run_code, run records and languages_list.

// RunCodeRequest is the input of run_code.
type RunCodeRequest struct {
	Language string `json:"language" jsonschema_description:"Language (see languages_list), e.g. python, c, node."`
	// Code is the main file's content; Files are more files (or all of
	// them), by path relative to /workspace (or absolute under it).
	Code  string            `json:"code,omitempty" jsonschema_description:"Source of the main file. Give code, files, or both."`
	Files map[string]string `json:"files,omitempty" jsonschema_description:"More files (or all of them): path relative to /workspace -> content. Dependency manifests among them (requirements.txt, package.json, go.mod, Cargo.toml) are installed first."`
	// Entrypoint names the file to run among Files (default: the
	// language's entrypoint, or the only source file).
	Entrypoint     string            `json:"entrypoint,omitempty" jsonschema_description:"The file to run among files (default: the language's entrypoint, or the only source file)."`
	Args           []string          `json:"args,omitempty" jsonschema_description:"Command-line arguments of the program."`
	Stdin          string            `json:"stdin,omitempty" jsonschema_description:"Text written to the program's standard input."`
	Env            map[string]string `json:"env,omitempty" jsonschema_description:"Environment variables of every step."`
	SandboxID      string            `json:"sandbox_id,omitempty" jsonschema_description:"Run in this live sandbox (its language must match; files written there stay). Default: a fresh sandbox, removed afterwards."`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty" jsonschema_description:"Time limit of the whole run (install, compile and run together)."`
	// Install runs the dependency installers for the manifests among the
	// files (requirements.txt, package.json, go.mod, Cargo.toml); default true.
	Install *bool  `json:"install,omitempty" jsonschema_description:"Install dependencies found in the files (default true)."`
	Network string `json:"network,omitempty" jsonschema_description:"Network of the fresh sandbox: none (default) or egress (dependency installs then fetch from the configured package indexes)." jsonschema:"enum=none,enum=egress,enum=allowlist"`
	// Limits of the ephemeral sandbox (ignored with SandboxID).
	MemoryMB *int64   `json:"memory_mb,omitempty" jsonschema_description:"Memory limit of the fresh sandbox in MiB."`
	DiskMB   *int64   `json:"disk_mb,omitempty" jsonschema_description:"Disk limit of the fresh sandbox in MiB."`
	CPUs     *float64 `json:"cpus,omitempty" jsonschema_description:"CPU limit of the fresh sandbox in cores, e.g. 0.5."`
	// Backend of the fresh sandbox: "" (a container) or "vm" (a QEMU
	// guest made from the language's image, images build --vm LANGUAGE).
	Backend string `json:"backend,omitempty" jsonschema_description:"What the fresh sandbox is: container (default) or vm (a QEMU guest of the language; slower to start)." jsonschema:"enum=container,enum=vm"`
	// Root runs the fresh sandbox in root mode (CreateSandboxRequest.Root).
	Root bool `json:"root,omitempty" jsonschema_description:"Run as root (uid 0) inside the fresh sandbox; the host sees an unprivileged uid."`
	// MaxOutputBytes caps each stream in the result; 0 means the configured
	// output limit. The run record keeps up to runs.log_cap regardless.
	MaxOutputBytes int64 `json:"-"`
}

// RunStep is the outcome of one step of a run.
type RunStep struct {
	Name            string      `json:"name"`
	ExitCode        int         `json:"exit_code"`
	Stdout          string      `json:"stdout"`
	Stderr          string      `json:"stderr"`
	StdoutTruncated bool        `json:"stdout_truncated,omitempty"`
	StderrTruncated bool        `json:"stderr_truncated,omitempty"`
	Termination     Termination `json:"termination"`
	DurationMS      int64       `json:"duration_ms"`
	// BlockedSyscalls: see ExecResult.
	BlockedSyscalls []BlockedSyscall `json:"blocked_syscalls,omitempty"`
}

// RunResult is the outcome of run_code: the steps, and at the top level the
// last step that ran (the run step, or the one that failed).
type RunResult struct {
	RunID           string      `json:"run_id"`
	SandboxID       string      `json:"sandbox_id"`
	Language        string      `json:"language"`
	Success         bool        `json:"success"`
	Steps           []RunStep   `json:"steps"`
	ExitCode        int         `json:"exit_code"`
	Stdout          string      `json:"stdout"`
	Stderr          string      `json:"stderr"`
	StdoutTruncated bool        `json:"stdout_truncated"`
	StderrTruncated bool        `json:"stderr_truncated"`
	Termination     Termination `json:"termination"`
	DurationMS      int64       `json:"duration_ms"`
	// BlockedSyscalls are the syscalls seccomp refused in any step.
	BlockedSyscalls []BlockedSyscall `json:"blocked_syscalls,omitempty"`
	// OutputFiles lists what the program left in /workspace/output (kept
	// in the run record's output/).
	OutputFiles []string `json:"output_files,omitempty"`
	// Note says where output cut to fit a tool result went (MCP only).
	Note string `json:"note,omitempty"`
	// NetworkRefusals lists the hosts an allowlist sandbox (sandbox_id)
	// was refused during this run (MCP only).
	NetworkRefusals *NetworkRefusals `json:"network_refusals,omitempty"`
}

// LanguageInfo is one entry of languages_list.
type LanguageInfo struct {
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	Image       string   `json:"image"`
	ImageReady  bool     `json:"image_ready"`
	Extensions  []string `json:"extensions"`
	Entrypoint  string   `json:"entrypoint"`
	Tasks       []string `json:"tasks"`
	Managers    []string `json:"managers,omitempty"`
	Compiled    bool     `json:"compiled"`
	Description string   `json:"description,omitempty"`
}

// RunFilter selects run records (run_list).
type RunFilter struct {
	Limit    int    `json:"limit,omitempty"` // default 50, at most 1000
	Language string `json:"language,omitempty"`
	Success  *bool  `json:"success,omitempty"`
}

// RunTermination is how a run ended, as metadata.json spells it.
type RunTermination struct {
	Cause    string `json:"cause"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// RunStepRecord is one step of a run in metadata.json.
type RunStepRecord struct {
	Name            string           `json:"name"`
	Argv            []string         `json:"argv,omitempty"`
	ExitCode        int              `json:"exitCode"`
	DurationMS      int64            `json:"durationMs"`
	Termination     RunTermination   `json:"termination"`
	BlockedSyscalls []BlockedSyscall `json:"blockedSyscalls,omitempty"`
	StdoutBytes     int64            `json:"stdoutBytes"`
	StderrBytes     int64            `json:"stderrBytes"`
	StdoutTruncated bool             `json:"stdoutTruncated"`
	StderrTruncated bool             `json:"stderrTruncated"`
}

// RunMetadata is metadata.json: the fields docs/SPEC.md names first, then more.
type RunMetadata struct {
	RunID      string    `json:"runId"`
	Language   string    `json:"language"`
	StartTime  time.Time `json:"startTime"`
	EndTime    time.Time `json:"endTime"`
	DurationMS int64     `json:"durationMs"`
	ExitCode   int       `json:"exitCode"`
	Attempts   int       `json:"attempts"`
	Success    bool      `json:"success"`
	Image      string    `json:"image"`
	SandboxID  string    `json:"sandboxId"`
	// Tenant owns the run: the tenant of its sandbox.
	Tenant      string         `json:"tenant,omitempty"`
	Termination RunTermination `json:"termination"`

	Kind        string          `json:"kind"` // run | autofix
	ImageDigest string          `json:"imageDigest,omitempty"`
	Ephemeral   bool            `json:"ephemeral"`
	Entrypoint  string          `json:"entrypoint,omitempty"`
	Args        []string        `json:"args,omitempty"`
	Files       []string        `json:"files,omitempty"`
	Steps       []RunStepRecord `json:"steps"`
	// Bytes the steps wrote per stream, and whether the logs hold less
	// (the log cap).
	StdoutBytes  int64  `json:"stdoutBytes"`
	StderrBytes  int64  `json:"stderrBytes"`
	StdoutLogged int64  `json:"stdoutLogged"`
	StderrLogged int64  `json:"stderrLogged"`
	OutputFiles  int    `json:"outputFiles"`
	Error        string `json:"error,omitempty"`
	// ReplayOf is the run this one replayed (run_replay).
	ReplayOf string `json:"replayOf,omitempty"`
}

// FixedAttempt is one entry of fixed_attempts.json.
type FixedAttempt struct {
	Attempt    int    `json:"attempt"`
	Error      string `json:"error"`
	Fix        string `json:"fix"`
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	// Autofix: who wrote the fix, what it cost, and why it was refused
	// when it could not be applied (Fix is then empty).
	Termination string      `json:"termination,omitempty"`
	Provider    string      `json:"provider,omitempty"`
	Tokens      *TokenUsage `json:"tokens,omitempty"`
	Refused     string      `json:"refused,omitempty"`
}

// RunRecord is a stored run: its metadata and (the start of) its logs.
type RunRecord struct {
	Metadata        RunMetadata    `json:"metadata"`
	Stdout          string         `json:"stdout"`
	Stderr          string         `json:"stderr"`
	StdoutTruncated bool           `json:"stdout_truncated"`
	StderrTruncated bool           `json:"stderr_truncated"`
	Attempts        []FixedAttempt `json:"attempts"`
	Dir             string         `json:"dir"`
	// Code is the code snapshot: text files of code_snapshot/ by path
	// relative to it (autofix attempts under attempt_<n>/), each up to the
	// request's log size; CodeTruncated says some were cut or left out
	// (binary, or over the total cap).
	Code          map[string]string `json:"code"`
	CodeTruncated bool              `json:"code_truncated,omitempty"`
	// Note says where output cut to fit a tool result went (MCP only).
	Note string `json:"note,omitempty"`
}
