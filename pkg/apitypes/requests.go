package apitypes

import "time"

// The requests and results of commands, jobs, files and tasks, shared by the
// engine and every front end.

// ExecRequest is the input of exec_command.
type ExecRequest struct {
	SandboxID      string            `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Command        string            `json:"command,omitempty" jsonschema_description:"Shell command line, run with /bin/sh -c. Give command or argv."` // run with /bin/sh -c
	Argv           []string          `json:"argv,omitempty" jsonschema_description:"Program and arguments, run without a shell. Give command or argv."`
	Cwd            string            `json:"cwd,omitempty" jsonschema_description:"Working directory (absolute; default /workspace)."`
	Env            map[string]string `json:"env,omitempty" jsonschema_description:"Extra environment variables."`
	Stdin          string            `json:"stdin,omitempty" jsonschema_description:"Text written to the command's standard input."`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty" jsonschema_description:"Kill the command (its whole process group) after this many seconds."`
	// MaxOutputBytes caps each stream in the result (front ends size their
	// answers with it); 0 means the configured output limit.
	MaxOutputBytes int64 `json:"-"`
}

// JobStatusRequest is the input of job_status.
type JobStatusRequest struct {
	SandboxID    string `json:"sandbox_id"`
	JobID        string `json:"job_id"`
	StdoutOffset int64  `json:"stdout_offset,omitempty"`
	StderrOffset int64  `json:"stderr_offset,omitempty"`
	MaxBytes     int    `json:"max_bytes,omitempty"` // per stream; default 64 KiB
}

// TerminalRequest opens an interactive command on a pseudo-terminal.
type TerminalRequest struct {
	SandboxID string            `json:"sandbox_id"`
	Command   string            `json:"command,omitempty"`
	Argv      []string          `json:"argv,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Rows      uint16            `json:"rows,omitempty"`
	Cols      uint16            `json:"cols,omitempty"`
}

// FileWriteRequest is the input of file_write.
type FileWriteRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Path      string `json:"path" jsonschema_description:"Absolute path in the sandbox, normally under /workspace. Parent directories are created."`
	Content   string `json:"content" jsonschema_description:"The file's content: text, or base64 with encoding base64."`
	Encoding  string `json:"encoding,omitempty" jsonschema_description:"Encoding of content: utf-8 (default) or base64 (for binary files)." jsonschema:"enum=utf-8,enum=base64"` // utf-8 (default) or base64
	Mode      string `json:"mode,omitempty" jsonschema_description:"Octal permission bits, e.g. 0755 for a script; default 0644."`                                               // octal, e.g. "0755"
	Append    bool   `json:"append,omitempty" jsonschema_description:"Append to the file instead of replacing it."`
}

// FileResult is the outcome of file_write and file_delete.
type FileResult struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// FileReadRequest is the input of file_read.
type FileReadRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (sandbox_create)."`
	Path      string `json:"path" jsonschema_description:"Absolute path of a file in the sandbox."`
	Encoding  string `json:"encoding,omitempty" jsonschema_description:"utf-8 (default) or base64. Content that is not valid UTF-8 comes back as base64 whatever is asked, and encoding says so." jsonschema:"enum=utf-8,enum=base64"` // utf-8 (default) or base64
	Offset    int64  `json:"offset,omitempty" jsonschema_description:"Byte offset to start reading at (to page through a large file)."`
	MaxBytes  int64  `json:"max_bytes,omitempty" jsonschema_description:"Most bytes to return; capped so that the answer fits a tool result."`
}

// FileReadResult is the outcome of file_read.
type FileReadResult struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding"`
	Size      int64  `json:"size"`
	Offset    int64  `json:"offset"`
	Truncated bool   `json:"truncated"`
	// NextOffset is where the next read continues when Truncated.
	NextOffset int64 `json:"next_offset,omitempty"`
}

// RunTaskRequest is the input of run_task.
type RunTaskRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox whose language has the task (languages_list shows the tasks)."`
	Task      string `json:"task" jsonschema_description:"lint, build or test." jsonschema:"enum=lint,enum=build,enum=test"` // lint | build | test
	// Path is the task's target, relative to /workspace or absolute under
	// it (default: /workspace itself).
	Path           string            `json:"path,omitempty" jsonschema_description:"Target of the task, relative to /workspace or absolute under it; default /workspace."`
	Env            map[string]string `json:"env,omitempty" jsonschema_description:"Extra environment variables."`
	TimeoutSeconds *float64          `json:"timeout_seconds,omitempty" jsonschema_description:"Time limit of the task."`
	MaxOutputBytes int64             `json:"-"`
}

// PackagesInstallRequest is the input of packages_install.
type PackagesInstallRequest struct {
	SandboxID      string   `json:"sandbox_id" jsonschema_description:"Id of a live sandbox."`
	Manager        string   `json:"manager" jsonschema_description:"Package manager of the sandbox's language (languages_list: managers), e.g. pip, npm, cargo, go."`
	Packages       []string `json:"packages" jsonschema_description:"Package names or paths of local package files in the sandbox."`
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty" jsonschema_description:"Time limit of the installation."`
	MaxOutputBytes int64    `json:"-"`
}

// FileEntry is one entry of a directory listing (file_list).
type FileEntry struct {
	Path string `json:"path"`
	// Type is file, dir, symlink or other.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode holds the permission bits (including setuid, setgid, sticky).
	Mode  uint32    `json:"mode"`
	MTime time.Time `json:"mtime"`
}

// JobInfo describes one command a sandbox's agent knows about.
type JobInfo struct {
	ID          string    `json:"id"`
	Argv        []string  `json:"argv"`
	PID         int       `json:"pid"`
	State       string    `json:"state"` // running | finished
	TTY         bool      `json:"tty,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	StdoutBytes int64     `json:"stdout_bytes"`
	StderrBytes int64     `json:"stderr_bytes"`
	Exit        *JobExit  `json:"exit,omitempty"`
}

// JobExit is how a job ended.
type JobExit struct {
	Cause       string    `json:"cause"`
	ExitCode    int       `json:"exit_code"` // 128+n when killed by signal n
	Signal      string    `json:"signal,omitempty"`
	Detail      string    `json:"detail,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	FinishedAt  time.Time `json:"finished_at"`
	DurationMS  int64     `json:"duration_ms"`
	StdoutBytes int64     `json:"stdout_bytes"`
	StderrBytes int64     `json:"stderr_bytes"`
}

// JobKillRequest is the input of job_kill.
type JobKillRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of the sandbox the job runs in."`
	JobID     string `json:"job_id" jsonschema_description:"Job id from exec_command with background: true."`
	// Signal is a signal name; empty means SIGKILL.
	Signal string `json:"signal,omitempty" jsonschema_description:"Signal name, e.g. SIGTERM, SIGINT; default SIGKILL."`
}

// JobKillResult is the outcome of job_kill: the signal sent and the job's
// state after a short wait for it to end.
type JobKillResult struct {
	JobID  string `json:"job_id"`
	Signal string `json:"signal"`
	State  string `json:"state"`
}

// Image describes a built image, as clients see it: no host paths.
type Image struct {
	Name         string    `json:"name"`
	Digest       string    `json:"digest"`
	BuiltAt      time.Time `json:"built_at"`
	SizeBytes    int64     `json:"size_bytes"`
	BuildSeconds float64   `json:"build_seconds"`
	Suite        string    `json:"suite"`
	Packages     int       `json:"packages"` // how many Debian packages it holds
	// Users are the live sandboxes running on this image (its digest).
	Users []string `json:"users,omitempty"`
	// InUse counts Users (it stays right when a result cuts the list).
	InUse int `json:"in_use"`
	// Recipe is what builds this image, as image_build takes it: the
	// image's own name (a language or another recipe), or for a VM guest
	// image vm-NAME its NAME with VM true. Empty when no recipe of that
	// name is known any more.
	Recipe string `json:"recipe,omitempty"`
	VM     bool   `json:"vm,omitempty"`
	// UpToDate is whether the image is built from its recipe as it is now
	// (same digest); absent when that cannot be told (no recipe).
	UpToDate *bool `json:"up_to_date,omitempty"`
	// OCI is set for an image pulled from a registry or imported from an
	// archive (no recipe builds it).
	OCI *ImageOCI `json:"oci,omitempty"`
}

// ImageOCI is where an OCI image came from and the defaults its config
// gives sandboxes.
type ImageOCI struct {
	References     []string `json:"references"`
	ManifestDigest string   `json:"manifest_digest,omitempty"`
	ConfigDigest   string   `json:"config_digest"`
	Layers         []string `json:"layers"`
	WorkingDir     string   `json:"working_dir,omitempty"`
	User           string   `json:"user,omitempty"`
	UID            int      `json:"uid"`
	Entrypoint     []string `json:"entrypoint,omitempty"`
	Cmd            []string `json:"cmd,omitempty"`
	// Labels are the config's labels (LABEL of a Dockerfile build).
	Labels map[string]string `json:"labels,omitempty"`
}

// ImagePullRequest asks for an image from a registry.
type ImagePullRequest struct {
	// Reference is the image as registries name it:
	// registry[:port]/repository[:tag][@sha256:digest].
	Reference string `json:"reference" jsonschema:"image reference, e.g. registry.example:5000/team/python:3.12 or ...@sha256:<digest>"`
}

// ImageProgress is one step of a pull or an import: "resolved" (the
// image's digest and layer count), "layer" (one layer unpacked; Cached when
// the layer store had it), "done" (Image is ready; Bytes its size on disk).
type ImageProgress struct {
	Phase  string `json:"phase"`
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
	Layer  string `json:"layer,omitempty"`
	Index  int    `json:"index,omitempty"`
	Layers int    `json:"layers,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	Cached bool   `json:"cached,omitempty"`
}
