package apitypes

// ProcessRequest starts a command that its caller follows itself: output as
// it arrives, stdin written while it runs, signals, a terminal's size (the
// E2B front end's processes).
type ProcessRequest struct {
	SandboxID string            `json:"sandbox_id"`
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	// TTY runs the command on a pseudo-terminal of Rows x Cols; without it
	// stdout and stderr stay apart and stdin is a pipe.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Root runs the command as uid 0 (a root-mode sandbox only); otherwise
	// it runs as the sandbox user.
	Root bool `json:"root,omitempty"`
	// TimeoutSeconds kills the command after this many seconds; 0: none.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
}
