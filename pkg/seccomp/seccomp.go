// Package seccomp loads the Docker-format seccomp profiles in seccomp-profiles/
// and reports whether seccomp can be enforced by this build on this kernel.
//
// Security boundary: the profile is compiled into libcontainer's config and
// installed in every sandbox right before the agent (PID 1) execs, with
// no_new_privs set, so every command the agent spawns inherits it. Profiles
// are filtered by the sandbox's capability bounding set exactly as Docker does,
// so syscalls gated on CAP_SYS_ADMIN (mount, unshare, setns, ...) stay denied.
package seccomp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	mobyseccomp "github.com/moby/profiles/seccomp"
	lcseccomp "github.com/opencontainers/runc/libcontainer/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Unconfined is the profile name that disables seccomp. It must be chosen
// explicitly in the configuration.
const Unconfined = "unconfined"

// Support says whether seccomp filters can be enforced, and if not, why.
type Support struct {
	Build  bool   // libcontainer compiled with cgo and -tags seccomp
	Kernel bool   // the kernel supports seccomp filters
	Reason string // empty when both are true
}

// OK reports whether filters can be enforced.
func (s Support) OK() bool { return s.Build && s.Kernel }

// Check reports seccomp support of this build and kernel.
func Check() Support {
	s := Support{Build: lcseccomp.Enabled}
	// PR_GET_SECCOMP fails with EINVAL when the kernel lacks CONFIG_SECCOMP.
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err == nil {
		s.Kernel = true
	}
	var why []string
	if !s.Build {
		why = append(why, "binary built without seccomp support (needs cgo and -tags seccomp)")
	}
	if !s.Kernel {
		why = append(why, "kernel does not support seccomp")
	}
	s.Reason = strings.Join(why, "; ")
	return s
}

// ErrUnknownProfile is returned for a profile name with no file.
var ErrUnknownProfile = errors.New("unknown seccomp profile")

// Load reads profile name ("default" reads dir/default.json) and resolves it
// for this architecture and kernel and for the given capability bounding set
// (names like "CAP_KILL"). It returns nil for Unconfined.
func Load(dir, name string, bounding []string) (*specs.LinuxSeccomp, error) {
	if name == Unconfined {
		return nil, nil
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("%w: invalid name %q", ErrUnknownProfile, name)
	}
	path := filepath.Join(dir, name+".json")
	body, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %q: %s does not exist", ErrUnknownProfile, name, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read seccomp profile: %w", err)
	}
	// LoadProfile filters rules by the process's capabilities; it needs the
	// bounding set in a spec.
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: bounding}}}
	prof, err := mobyseccomp.LoadProfile(string(body), spec)
	if err != nil {
		return nil, fmt.Errorf("parse seccomp profile %s: %w", path, err)
	}
	return prof, nil
}
