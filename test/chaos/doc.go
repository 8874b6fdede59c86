// Package chaos is `make chaos` and `make soak`: black-box tests of a real
// mcp-sandboxd (bin/mcp-sandboxd, driven through internal/testenv's daemon
// driver, as test/e2e does) under load through its real clients — the Go
// REST client (pkg/api/client) and MCP over the daemon's socket.
//
// The chaos test (build tag chaos) kills the daemon with SIGKILL at random
// moments, at least 50 times, while eight clients create, exec in, write
// to, snapshot, restore, expose and terminate sandboxes, run code and start
// a VM; after each restart it checks that the daemon is ready within 2 s,
// that every acknowledged operation is in the state, that every half-made
// sandbox is failed with its reason and released, that no process of the
// killed daemon survived, and that no client waited out its timeout. At the
// end nothing may be left on the host. CHAOS_SEED replays a run's choices.
//
// The soak (build tag soak) runs create/exec/terminate cycles with four
// clients and samples the daemon's memory, descriptors and goroutines to
// find leaks.
//
// Both are behind build tags so that `make test` (./...) runs neither.
package chaos
