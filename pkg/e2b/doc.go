// Package e2b serves E2B's wire protocol, so that the official E2B SDKs
// (npm and PyPI "e2b") and the agent frameworks built on them drive
// mcp-sandboxd by changing a URL:
//
//   - the control plane (JSON over HTTP, X-API-Key): create, get, list,
//     kill, pause, connect (resume), timeout and metrics of sandboxes, and
//     the templates (our images);
//   - the data plane of E2B's in-sandbox daemon, envd: its Connect-RPC
//     services process.Process and filesystem.Filesystem (connectrpc.com/
//     connect over the .proto files vendored in third_party/envd) and its
//     HTTP /files and /health, served by the daemon on the host and
//     translated onto the engine's operations (nothing runs inside the
//     sandbox but our agent);
//   - routing: by the E2b-Sandbox-Id / E2b-Sandbox-Port headers on one URL
//     (E2B_SANDBOX_URL), or by host name {port}-{sandboxID}.{domain}; port
//     49983 is envd, any other port is relayed into the sandbox.
//
// It is a thin front end like pkg/api: Backend is the narrow slice of the
// engine it uses, *engine.Engine provides it through FromEngine, and the
// handlers only decode, call and encode. The E2B sandbox id is our id
// without its dash (sb-0123 is sb0123): E2B's proxies and SDKs take ids of
// lowercase letters and digits only.
package e2b
