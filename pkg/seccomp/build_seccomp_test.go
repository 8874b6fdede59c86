//go:build cgo && seccomp

package seccomp

// builtWithSeccomp is what Check must report as Build: libcontainer's
// seccomp support is compiled in exactly under these tags.
const builtWithSeccomp = true
