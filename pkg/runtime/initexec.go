package runtime

// The hand-over of `runc init` from the daemon to sandbox-init.
//
// libcontainer starts every container's init by executing a sealed clone of
// /proc/self/exe — the daemon, 143 MB with client-go, prometheus and mcp-go's
// JSON schema compiler — with the argument "init". nsenter's C constructor
// (nsexec) sets up the namespaces before the Go runtime starts; then the Go
// runtime and every package initialiser of the daemon run (about 16 ms on an
// idle host, several times that on a busy one), all of it only to reach
// libcontainer.Init. sandbox-init is that Init alone (about 1 ms of Go
// start-up).
//
// How the child finds it: UseInitBinary (runtime.go) makes a sealed memfd copy of
// sandbox-init once, when the runtime is set up, and Start appends it to the
// init process's ExtraFiles, after the agent's own descriptors and before
// libcontainer's _LIBCONTAINER_* descriptors. sandboxd_initexec, a C
// constructor that runs before nsexec (constructors with a priority run
// before those without), looks in a `runc init` child for a descriptor below
// _LIBCONTAINER_INITPIPE that is a memfd with exactly the name and the seals
// UseInitBinary gave it, marks it close-on-exec (so that the memfd reaches
// neither sandbox-init nor the agent: its slot is a hole from then on, and
// the other descriptor numbers stay as they were), and execveat(2)s it with
// the same argv and environment.
// The pid, the descriptors and the environment are unchanged by an exec, so
// libcontainer, which holds the child's pid and the other ends of its pipes,
// sees no difference; nsexec then runs in sandbox-init.
//
// Security boundary (docs/security.md, "runc init"): the binary a container's
// init runs is the sealed memfd (F_SEAL_SEAL|SHRINK|GROW|WRITE: nobody, root
// of the host included, can write it through /proc/<pid>/exe or its
// descriptor), never sandbox-init's file on disk, for the same reason that
// libcontainer clones its own binary (CVE-2019-5736). The descriptor is
// found by name and seals, not by position alone, and anything else falls
// back to the daemon's own init (the way it ran before).
//
// The constructor itself is in initexec_cgo.go.

import (
	"fmt"
	"os"

	"github.com/opencontainers/runc/libcontainer/exeseal"
)

// initMemfdName is the memfd's name (exeseal prefixes "runc_cloned:"); the
// constructor (initexec_cgo.go) recognises the descriptor by it.
const initMemfdName = "sandbox-init"

// InitBinaryName is the file name of sandbox-init, installed beside the agent.
const InitBinaryName = "sandbox-init"

// sealInitBinary copies the sandbox-init binary at path into a sealed memfd.
// tmpDir is exeseal's fallback when memfds are unavailable, in which case the
// copy is not a memfd and is refused: the constructor would not recognise it.
func sealInitBinary(path, tmpDir string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := exeseal.CloneBinary(src, st.Size(), initMemfdName, tmpDir)
	if err != nil {
		return nil, err
	}
	if !exeseal.IsCloned(f) {
		f.Close()
		return nil, fmt.Errorf("sealed copy of %s is not a sealed memfd", path)
	}
	return f, nil
}
