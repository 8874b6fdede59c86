package apitypes

// AgentRunRequest is the input of agent_run: a coding agent (Claude Code
// in print mode) works on files in a fresh sandbox whose only reachable
// destination is the daemon's credential proxy.
type AgentRunRequest struct {
	Prompt         string            `json:"prompt" jsonschema_description:"The task for the agent."`
	Files          map[string]string `json:"files,omitempty" jsonschema_description:"Files to start from: path relative to /workspace -> content."`
	Language       string            `json:"language,omitempty" jsonschema_description:"Image the agent runs in; it must carry the Claude Code CLI. Default: agent."`
	MaxTurns       int               `json:"max_turns,omitempty" jsonschema_description:"Most agent turns (default 20, at most 200)."`
	TimeoutSeconds float64           `json:"timeout,omitempty" jsonschema_description:"Seconds the session may take (default 600)."`
	// SandboxID runs the session in an existing sandbox (granted the
	// credential) instead of a fresh one, which is then kept.
	SandboxID string `json:"sandbox_id,omitempty" jsonschema_description:"Run in this live sandbox (created with the credential) instead of a fresh one; it is kept afterwards."`
}

// AgentProgress is one progress notification of an agent session.
type AgentProgress struct {
	Kind string `json:"kind"` // started, tool_call, file_changed, text, result
	Tool string `json:"tool,omitempty"`
	// Detail is the tool's main argument (a path, a command), or text.
	Detail string `json:"detail,omitempty"`
	// RunID and SandboxID are set on the first event (started): the run
	// record the transcript goes to and the sandbox the agent runs in.
	RunID     string `json:"run_id,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// String is the event as one line of text, as the MCP progress
// notifications, the run record's stdout.log and sandboxctl show it.
func (p AgentProgress) String() string {
	if p.Kind == "started" {
		return "started run " + p.RunID + " in sandbox " + p.SandboxID
	}
	s := p.Kind
	for _, f := range []string{p.Tool, p.Detail} {
		if f != "" {
			s += " " + f
		}
	}
	return s
}

// AgentFileChange is a file the session added, modified or deleted.
type AgentFileChange struct {
	Path   string `json:"path"`
	Status string `json:"status"` // added, modified, deleted
}

// AgentRunResult is the outcome of agent_run.
type AgentRunResult struct {
	SandboxID string `json:"sandbox_id"`
	// RunID is the session's run record (kind "agent"): the input files,
	// the transcript, the progress log and this result.
	RunID string `json:"run_id"`
	// Success: the agent ended its session without error.
	Success bool `json:"success"`
	// Cause says why a session did not succeed: agent_error, max_turns,
	// timeout, spend_cap (with the cap), or the CLI's own subtype.
	Cause    string            `json:"cause,omitempty"`
	Summary  string            `json:"summary"`
	NumTurns int               `json:"num_turns"`
	Files    map[string]string `json:"files"` // final text files under /workspace
	Changes  []AgentFileChange `json:"changes"`
	// Diff is the unified diff of the text files from the input to the
	// final files ("" when none changed).
	Diff string `json:"diff"`
	// Usage is what the credential proxy counted for the sandbox.
	Usage CredentialUsage `json:"usage"`
	// Transcript is the path (on the daemon's host) of the session's
	// stream-json transcript: transcript.jsonl in the run record.
	Transcript string `json:"transcript"`
	ExitCode   int    `json:"exit_code"`
}
