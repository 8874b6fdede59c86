package agent

// The sudo channel: how `sudo` works in a sandbox whose commands run as an
// unprivileged user but whose creator may run them as root (the E2B front
// end's sandboxes, where every template's user has password-less sudo).
//
// Every sandbox runs with no_new_privs and its file systems mounted nosuid,
// so a set-uid sudo cannot raise anything. Instead /usr/bin/sudo in the
// images is a link to the agent's binary, which, called as "sudo", is a
// client (cmd/sandbox-agent/sudo.go): it sends its argv, environment and
// working directory with its three standard descriptors over SudoSocket,
// and the agent, already holding root's identity in the sandbox's user
// namespace, starts the command as the asked uid on exactly those
// descriptors (pkg/agent/server/sudo.go).
//
// Security boundary: the agent listens on SudoSocket only when started with
// --root-mode, i.e. in sandboxes whose creator asked for root and whose
// root is an unprivileged uid range on the host; any process of such a
// sandbox may use it, exactly as sudoers' "user ALL=(ALL) NOPASSWD: ALL"
// would allow. The socket is abstract, so it lives in the sandbox's own
// network namespace and nothing outside the sandbox reaches it; the agent
// also refuses peers outside its PID namespace (SO_PEERCRED pid 0).

// SudoSocket is the abstract unix socket (a leading NUL) of the sudo
// channel, in the sandbox's network namespace.
const SudoSocket = "@sandboxd-sudo"

// SudoRequest is the client's one request, sent as a JSON line with its
// standard input, output and error as SCM_RIGHTS.
type SudoRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
	UID  int      `json:"uid"`
	GID  int      `json:"gid"`
}

// SudoMessage is a JSON line in either direction after the request: the
// client forwards signals it receives (Signal); the agent answers once
// with Error (the command did not start) or, when it ends, with Exit.
type SudoMessage struct {
	Signal string      `json:"signal,omitempty"`
	Error  string      `json:"error,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
}
