//go:build !cgo || !seccomp

package seccomp

// builtWithSeccomp is what Check must report as Build: without cgo and
// -tags seccomp libcontainer has no seccomp support.
const builtWithSeccomp = false
