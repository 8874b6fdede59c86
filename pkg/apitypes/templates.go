package apitypes

import "time"

// TemplateReady is how a template's sandbox is known to be ready once its
// start command runs: a TCP port inside the sandbox that accepts a
// connection, or a command that exits 0. Exactly one is set.
type TemplateReady struct {
	Port           int    `json:"port,omitempty" jsonschema_description:"A TCP port inside the sandbox (1-65535): ready once it accepts a connection."`
	Command        string `json:"command,omitempty" jsonschema_description:"A shell command: ready once it exits 0 (retried)."`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty" jsonschema_description:"How long the start command may take to become ready (default 60, at most 600)."`
}

// TemplateCreateRequest is the input of template_create (POST
// /v1/templates): a named image with a start command, a readiness check,
// default limits and network policy, and a warm pool size.
type TemplateCreateRequest struct {
	Name         string            `json:"name" jsonschema_description:"Template name: 1 to 63 lowercase letters, digits and - (starting and ending with a letter or digit). The E2B-compatible API takes it as templateID."`
	Image        string            `json:"image" jsonschema_description:"Image (a language, see languages_list) the sandboxes run."`
	StartCommand string            `json:"start_command,omitempty" jsonschema_description:"Shell command started in the background in every sandbox of the template (a server, say); sandbox_create returns once ready says so."`
	Ready        *TemplateReady    `json:"ready,omitempty" jsonschema_description:"Readiness check of the start command (required with start_command): port or command."`
	MemoryMB     *int64            `json:"memory_mb,omitempty" jsonschema_description:"Default memory limit in MiB."`
	CPUs         *float64          `json:"cpus,omitempty" jsonschema_description:"Default CPU limit in cores."`
	DiskMB       *int64            `json:"disk_mb,omitempty" jsonschema_description:"Default disk in MiB."`
	Network      string            `json:"network,omitempty" jsonschema_description:"Default network mode: none, egress or allowlist." jsonschema:"enum=none,enum=egress,enum=allowlist"`
	Allow        []string          `json:"allow,omitempty" jsonschema_description:"With network allowlist: what is reachable."`
	Env          map[string]string `json:"env,omitempty" jsonschema_description:"Environment of every command (a create's env adds to it)."`
	Pool         int               `json:"pool,omitempty" jsonschema_description:"Warm sandboxes kept ready (start command ready) for this template (0: none; at most sandbox.max_sandboxes)."`
}

// Template is a stored template.
type Template struct {
	TemplateCreateRequest
	CreatedAt time.Time `json:"created_at"`
	// Warm is how many ready sandboxes of the template wait in the pool.
	Warm int `json:"warm"`
}

// TemplateRef names one template (template_get, template_delete).
type TemplateRef struct {
	Name string `json:"name" jsonschema_description:"Template name."`
}

// TemplateList is the answer of template_list (GET /v1/templates).
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// TemplateDeleteResult is the answer of template_delete.
type TemplateDeleteResult struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}
