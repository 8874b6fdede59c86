// Package server is the sandbox side of the agent protocol (package agent):
// it runs as PID 1 of a container sandbox (cmd/sandbox-agent) or as a
// service in a VM guest, reaps zombies, runs commands as jobs that survive
// daemon restarts, streams their output, and serves file operations confined
// to the sandbox root. It serves any net.Listener or net.Conn, so the same
// server runs behind a unix socket, a virtio-serial port or vsock.
//
// Security boundary: only the host daemon can reach the transport (the
// socket's directory is root-only in a container). Commands run in their own
// session as the sandbox user without capabilities. File paths resolve with
// openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS), so symlinks planted by
// sandboxed code cannot lead the server outside the root, and PrivateDir is
// refused to file operations.
package server
