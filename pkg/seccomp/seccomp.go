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
	"encoding/json"
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

// Rule is a rule the configuration adds to a profile (sandbox.seccomp_rules):
// the named syscalls get Action (an SCMP_ACT_* name) and, for
// SCMP_ACT_ERRNO, ErrnoRet. Every rule the profile had for those names is
// dropped first, so a rule can deny what the profile allows and vice versa
// without copying the profile.
type Rule struct {
	Names    []string `yaml:"names" json:"names"`
	Action   string   `yaml:"action" json:"action"`
	ErrnoRet *uint    `yaml:"errno_ret,omitempty" json:"errno_ret,omitempty"`
}

// Actions a Rule may name.
var ruleActions = map[string]bool{"SCMP_ACT_ALLOW": true, "SCMP_ACT_ERRNO": true, "SCMP_ACT_KILL_PROCESS": true, "SCMP_ACT_LOG": true}

// CheckRule reports what is wrong with r, or nil.
func CheckRule(r Rule) error {
	if len(r.Names) == 0 {
		return errors.New("names is empty")
	}
	for _, n := range r.Names {
		if n == "" || strings.ContainsAny(n, " /\x00") {
			return fmt.Errorf("invalid syscall name %q", n)
		}
	}
	if !ruleActions[r.Action] {
		return fmt.Errorf("action %q is not one of SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS, SCMP_ACT_LOG", r.Action)
	}
	if r.ErrnoRet != nil && r.Action != "SCMP_ACT_ERRNO" {
		return errors.New("errno_ret is only valid with SCMP_ACT_ERRNO")
	}
	return nil
}

// Profiles lists the profile names in dir (NAME.json).
func Profiles(dir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range m {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	return names, nil
}

// Load reads profile name ("default" reads dir/default.json), applies the
// extra rules and resolves it for this architecture and kernel and for the
// given capability bounding set (names like "CAP_KILL"). It returns nil for
// Unconfined.
func Load(dir, name string, bounding []string, extra ...Rule) (*specs.LinuxSeccomp, error) {
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
	if len(extra) > 0 {
		if body, err = addRules(body, extra); err != nil {
			return nil, fmt.Errorf("seccomp profile %s: %w", path, err)
		}
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

// addRules drops every rule of body naming a syscall of extra and appends
// extra.
func addRules(body []byte, extra []Rule) ([]byte, error) {
	var prof mobyseccomp.Seccomp
	if err := json.Unmarshal(body, &prof); err != nil {
		return nil, err
	}
	replaced := map[string]bool{}
	for _, r := range extra {
		if err := CheckRule(r); err != nil {
			return nil, err
		}
		for _, n := range r.Names {
			replaced[n] = true
		}
	}
	var kept []*mobyseccomp.Syscall
	for _, sc := range prof.Syscalls {
		names := sc.Names[:0:0]
		for _, n := range sc.Names {
			if !replaced[n] {
				names = append(names, n)
			}
		}
		// (A legacy single-"name" entry has no Names and is kept as it is.)
		if len(names) == 0 && len(sc.Names) > 0 {
			continue
		}
		sc.Names = names
		kept = append(kept, sc)
	}
	for _, r := range extra {
		sc := &mobyseccomp.Syscall{LinuxSyscall: specs.LinuxSyscall{
			Names: r.Names, Action: specs.LinuxSeccompAction(r.Action), ErrnoRet: r.ErrnoRet,
		}, Comment: "added by sandbox.seccomp_rules"}
		kept = append(kept, sc)
	}
	prof.Syscalls = kept
	return json.Marshal(&prof)
}
