//go:build !cgo

package server

// The job-exec helper is C (jobexec_cgo.go): an agent built without cgo
// could start no command in a sandbox, so it does not build.
var _ = theJobExecHelperNeedsCgo
