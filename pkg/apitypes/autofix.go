package apitypes

import "time"

// The objects of the autofix loop (SPEC.md: autofix, autofix_submit,
// autofix_status, /v1/autofix, fixed_attempts.json).

// Autofix success rules: when a run counts as fixed.
const (
	// SuccessExitZeroEmptyStderr: every step exits 0 and the program's
	// run step writes nothing but white space to stderr.
	SuccessExitZeroEmptyStderr = "exit_zero_and_empty_stderr"
	// SuccessExitZero: every step exits 0.
	SuccessExitZero = "exit_zero"
	// SuccessTests: every step exits 0 and then the language's test task
	// (or the given test command) exits 0 too.
	SuccessTests = "tests"
)

// Autofix providers: who writes the fixes.
const (
	ProviderClient    = "client"    // the MCP client, through autofix_submit
	ProviderSampling  = "sampling"  // the MCP client's model, through sampling/createMessage
	ProviderAnthropic = "anthropic" // the Anthropic Messages API
	ProviderCommand   = "command"   // a configured program: prompt on stdin, answer on stdout
	ProviderAgent     = "agent"     // an agent session (Claude Code) in the loop's sandbox, the key kept by the credential proxy
)

// Autofix loop statuses.
const (
	AutofixRunning  = "running"   // an attempt or a fix request is under way
	AutofixNeedsFix = "needs_fix" // provider client: waiting for autofix_submit
	AutofixFixed    = "fixed"     // the last attempt met the success rule
	AutofixFailed   = "failed"    // stopped without success (see StopReason)
	AutofixExpired  = "expired"   // a client session nobody answered in time
)

// Why a loop stopped.
const (
	StopSuccess       = "success"
	StopMaxRetries    = "max_retries"    // max_retries fix requests were spent
	StopTimeout       = "timeout"        // the loop's total time ran out
	StopNoChange      = "no_change"      // the provider answered with the code unchanged
	StopRepeatedError = "repeated_error" // the same code failed the same way twice
	StopProviderError = "provider_error" // the provider failed (its message is in Error)
	StopExpired       = "expired"        // a client session expired
	StopError         = "error"          // an attempt could not be run (Error says why)
)

// AutofixRequest is the input of autofix (POST /v1/autofix).
type AutofixRequest struct {
	Language string `json:"language" jsonschema_description:"Language of the program (see languages_list)."`
	// Code is the entrypoint's content; Files are more files (or all of
	// them), by path relative to /workspace (or absolute under it).
	Code       string            `json:"code,omitempty" jsonschema_description:"Content of the main file (or give files)."`
	Files      map[string]string `json:"files,omitempty" jsonschema_description:"Files by path relative to /workspace: {path: content}."`
	Entrypoint string            `json:"entrypoint,omitempty" jsonschema_description:"File to run among files (default: the language's entrypoint or the only source file)."`
	Args       []string          `json:"args,omitempty" jsonschema_description:"Arguments of the program."`
	Stdin      string            `json:"stdin,omitempty" jsonschema_description:"Standard input of the program."`
	// MaxRetries bounds the fix requests (default autofix.max_retries, at
	// most autofix.max_retries_cap); attempts (runs) are at most one more.
	MaxRetries *int `json:"max_retries,omitempty" jsonschema_description:"Fix requests after the first run (default 5, at most 20). attempts counts runs: the original is attempt 1."`
	// TimeoutSeconds bounds the whole loop, fix requests included.
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty" jsonschema_description:"Time limit of the whole loop in seconds (default 300)."`
	Success        string   `json:"success,omitempty" jsonschema_description:"When a run counts as fixed: exit_zero_and_empty_stderr (default), exit_zero, or tests (the language's test task, or test_command, must pass too)."`
	// TestCommand replaces the language's test task under success "tests"
	// (run with /bin/sh -c in /workspace).
	TestCommand string `json:"test_command,omitempty" jsonschema_description:"With success tests: a shell command to run instead of the language's test task."`
	Provider    string `json:"provider,omitempty" jsonschema_description:"Who writes the fixes, among the configured: client (you, through autofix_submit), sampling (your model, through sampling/createMessage), anthropic, command. Default from the server configuration."`
	Network     string `json:"network,omitempty" jsonschema_description:"Network of the loop's sandbox: none (default), egress or allowlist."`
}

// AutofixSubmitRequest is the input of autofix_submit: the client's fix.
type AutofixSubmitRequest struct {
	AutofixID string            `json:"autofix_id" jsonschema_description:"The autofix_id of a needs_fix answer."`
	Code      string            `json:"code,omitempty" jsonschema_description:"New content of the entrypoint (or give files)."`
	Files     map[string]string `json:"files,omitempty" jsonschema_description:"Changed files by path relative to /workspace: {path: content}. Unmentioned files stay as they are."`
	// Answer is a free-form answer (a unified diff or fenced blocks), as
	// a provider would give it.
	Answer string `json:"answer,omitempty" jsonschema_description:"Instead of code/files: a unified diff, or fenced code blocks whose info string ends with the file's path."`
}

// TokenUsage is what a provider's model consumed for one fix.
type TokenUsage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// AutofixAttempt is one attempt of the loop as the answers report it: the
// run and, when the run failed and a fix was asked for, the fix.
type AutofixAttempt struct {
	Attempt      int         `json:"attempt"`
	ExitCode     int         `json:"exit_code"`
	Termination  Termination `json:"termination"`
	Success      bool        `json:"success"`
	DurationMS   int64       `json:"duration_ms"`
	ErrorExcerpt string      `json:"error_excerpt,omitempty"`
	// FixSummary says what the fix that followed this attempt changed
	// (or why it was refused).
	FixSummary string      `json:"fix_summary,omitempty"`
	Refused    string      `json:"refused,omitempty"`
	Provider   string      `json:"provider,omitempty"`
	Tokens     *TokenUsage `json:"tokens,omitempty"`
	ProviderMS int64       `json:"provider_ms,omitempty"`
}

// AutofixResult is the answer of autofix, autofix_submit and
// autofix_status.
type AutofixResult struct {
	AutofixID  string `json:"autofix_id"`
	RunID      string `json:"run_id"`
	SandboxID  string `json:"sandbox_id,omitempty"`
	Language   string `json:"language"`
	Status     string `json:"status"` // running | needs_fix | fixed | failed | expired
	Success    bool   `json:"success"`
	StopReason string `json:"stop_reason,omitempty"`
	// Attempts counts runs: the original code is attempt 1.
	Attempts   int               `json:"attempts"`
	MaxRetries int               `json:"max_retries"`
	Provider   string            `json:"provider"`
	Entrypoint string            `json:"entrypoint"`
	Files      map[string]string `json:"files"`          // the final (or current) files
	Diff       string            `json:"diff,omitempty"` // original → final, unified
	LastResult *RunResult        `json:"last_result,omitempty"`
	History    []AutofixAttempt  `json:"attempts_detail"`
	Error      string            `json:"error,omitempty"`
	DurationMS int64             `json:"duration_ms"`
	// With status needs_fix: the failing attempt's error and a ready
	// prompt; answer with autofix_submit before ExpiresAt.
	Prompt    string     `json:"prompt,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Note says where output cut to fit a tool result went (MCP only).
	Note string `json:"note,omitempty"`
}

// AutofixEvent is one line of the /v1/autofix NDJSON stream and of the
// events WebSocket (type fix_attempt): an attempt's outcome or the loop's
// end.
type AutofixEvent struct {
	Type      string          `json:"type"` // attempt | fix | result
	AutofixID string          `json:"autofix_id"`
	RunID     string          `json:"run_id,omitempty"`
	Attempt   *AutofixAttempt `json:"attempt,omitempty"`
	Result    *AutofixResult  `json:"result,omitempty"`
}

// CorrectionRecord is one line of `sandboxctl runs export --format jsonl`:
// a failing program, its error, the fix and what came of it.
type CorrectionRecord struct {
	RunID    string            `json:"run_id"`
	Attempt  int               `json:"attempt"`
	Language string            `json:"language"`
	Code     map[string]string `json:"code"`
	Error    string            `json:"error"`
	Fix      string            `json:"fix"`
	Outcome  string            `json:"outcome"` // fixed | failed_again | refused
	Provider string            `json:"provider,omitempty"`
}
