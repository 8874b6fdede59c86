package apitypes

// The objects of run_replay: a recorded run re-run in a fresh sandbox and
// compared with the original.

// RunReplayRequest is the input of run_replay.
type RunReplayRequest struct {
	RunID string `json:"run_id" jsonschema_description:"The run record to replay (run_list, run_get): its code, files, args, stdin and env run again in a fresh sandbox on the same image digest, with the same limits."`
}

// RunReplay is the outcome of run_replay: the new run and how it differs
// from the original.
type RunReplay struct {
	// Original is the replayed run's id; the new record's metadata names
	// it as replayOf.
	Original string    `json:"original"`
	Replay   RunResult `json:"replay"`
	Diff     RunDiff   `json:"diff"`
	// Note says what the record could not bring back (a record made before
	// run inputs were kept replays without its stdin and env).
	Note string `json:"note,omitempty"`
}

// RunDiff is how a replay's outcome differs from the original's. Logs are
// compared as the two records keep them (every step's output, up to
// runs.log_cap); output files as the records' output/ holds them.
type RunDiff struct {
	// Same is true when exit code, logs and output files are all equal.
	Same     bool          `json:"same"`
	ExitCode *ExitCodeDiff `json:"exit_code,omitempty"`
	// Stdout and Stderr are unified diffs (original first), empty when the
	// logs are equal.
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	// Files lists the output files that differ, by path under
	// /workspace/output.
	Files []FileDiff `json:"files,omitempty"`
}

// ExitCodeDiff is an exit code that changed.
type ExitCodeDiff struct {
	Original int `json:"original"`
	Replay   int `json:"replay"`
}

// FileDiff is one output file that differs: added, removed or changed.
// A text file's change is a unified diff; a binary file's is its sizes and
// SHA-256s.
type FileDiff struct {
	Path   string `json:"path"`
	Change string `json:"change"` // added | removed | changed
	Binary bool   `json:"binary,omitempty"`
	Diff   string `json:"diff,omitempty"`
	// Sizes in bytes and SHA-256s (hex) of each side; absent for the side
	// that has no such file.
	OriginalSize   *int64 `json:"original_size,omitempty"`
	ReplaySize     *int64 `json:"replay_size,omitempty"`
	OriginalSHA256 string `json:"original_sha256,omitempty"`
	ReplaySHA256   string `json:"replay_sha256,omitempty"`
}
