// Package cgroupv2 is make test-cgroupv2: it boots the Linux test guest of
// the VM backend (pkg/vm) with only the unified cgroup hierarchy mounted
// and runs the sandbox core's cgroup integration tests (pkg/engine's test
// binary, with the static sandbox-agent and the shell image on a second
// disk) inside it, so that the cgroup v2 code paths are exercised on a host
// that is itself hybrid or v1. The test is behind the build tag cgroupv2
// so that make test (./...) does not run it; make test-cgroupv2 sets it.
package cgroupv2
