// Package helm holds the Helm chart of a SandboxRunner fleet
// (mcp-sandboxd/: the node daemon DaemonSet, the gateway, RBAC, the admin
// key) and its tests, which render the chart with Helm's Go SDK and decode
// every object strictly into the Kubernetes API types. It has no code of
// its own: the chart is data, installed with `helm install`.
package helm
