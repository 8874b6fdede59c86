package seccomp

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

var profiles = filepath.Join(testenv.RepoRoot, "seccomp-profiles")

func TestLoadDefaultProfile(t *testing.T) {
	caps := []string{"CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}
	prof, err := Load(profiles, "default", caps)
	if err != nil {
		t.Fatal(err)
	}
	if prof == nil || prof.DefaultAction != "SCMP_ACT_ERRNO" || len(prof.Syscalls) == 0 {
		t.Fatalf("default profile = %+v", prof)
	}
	allowed := map[string]bool{}
	for _, sc := range prof.Syscalls {
		if sc.Action == "SCMP_ACT_ALLOW" && len(sc.Args) == 0 {
			for _, n := range sc.Names {
				allowed[n] = true
			}
		}
	}
	// Without CAP_SYS_ADMIN in the bounding set, Docker's rules for mount,
	// unshare and setns are not included; keyctl is never allowed.
	for _, n := range []string{"mount", "unshare", "setns", "keyctl", "add_key"} {
		if allowed[n] {
			t.Errorf("%s is allowed unconditionally", n)
		}
	}
	for _, n := range []string{"read", "write", "execve", "setuid", "kill"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed", n)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	if prof, err := Load(profiles, Unconfined, nil); err != nil || prof != nil {
		t.Errorf("unconfined = %v, %v; want nil, nil", prof, err)
	}
	for _, name := range []string{"missing", "../default", "", "a/b"} {
		if _, err := Load(profiles, name, nil); !errors.Is(err, ErrUnknownProfile) {
			t.Errorf("Load(%q) = %v, want ErrUnknownProfile", name, err)
		}
	}
}

// TestCheck compares Check with what this test binary and kernel are: the
// build tags decide Build, and the kernel has seccomp exactly when
// /proc/self/status has a Seccomp field (CONFIG_SECCOMP). Under make test
// (SANDBOXD_INTEGRATION=1) seccomp must be available: sandboxes need it.
func TestCheck(t *testing.T) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	kernel := regexp.MustCompile(`(?m)^Seccomp:\s+\d+$`).Match(status)

	s := Check()
	if s.Build != builtWithSeccomp {
		t.Errorf("Check().Build = %v, but this binary was built with seccomp support = %v", s.Build, builtWithSeccomp)
	}
	if s.Kernel != kernel {
		t.Errorf("Check().Kernel = %v, but /proc/self/status says kernel seccomp support = %v", s.Kernel, kernel)
	}
	if s.OK() != (s.Build && s.Kernel) {
		t.Errorf("OK() = %v for %+v", s.OK(), s)
	}
	// The reason names exactly what is missing.
	for _, c := range []struct {
		missing bool
		phrase  string
	}{
		{!s.Build, "built without seccomp support"},
		{!s.Kernel, "kernel does not support seccomp"},
	} {
		if strings.Contains(s.Reason, c.phrase) != c.missing {
			t.Errorf("Reason %q: mentions %q = %v, want %v", s.Reason, c.phrase, !c.missing, c.missing)
		}
	}
	if s.OK() != (s.Reason == "") {
		t.Errorf("OK() = %v with reason %q", s.OK(), s.Reason)
	}
	if os.Getenv("SANDBOXD_INTEGRATION") == "1" && !s.OK() {
		t.Errorf("make test needs seccomp (cgo, -tags seccomp, a kernel with CONFIG_SECCOMP): %s", s.Reason)
	}
}

func TestLoadWithExtraRules(t *testing.T) {
	dir := profiles
	one := uint(1)
	// ptrace is allowed by default.json; the rule refuses it, and allows
	// keyctl, which the profile refuses.
	prof, err := Load(dir, "default", nil,
		Rule{Names: []string{"ptrace"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &one},
		Rule{Names: []string{"keyctl"}, Action: "SCMP_ACT_ALLOW"})
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string][]specs.LinuxSeccompAction{}
	for _, sc := range prof.Syscalls {
		for _, n := range sc.Names {
			actions[n] = append(actions[n], sc.Action)
		}
	}
	if a := actions["ptrace"]; len(a) != 1 || a[0] != specs.ActErrno {
		t.Errorf("ptrace rules %v, want one ERRNO", a)
	}
	if a := actions["keyctl"]; len(a) != 1 || a[0] != specs.ActAllow {
		t.Errorf("keyctl rules %v, want one ALLOW", a)
	}
	if len(actions["read"]) == 0 {
		t.Error("the rest of the profile was lost")
	}
	if _, err := Load(dir, "default", nil, Rule{Names: []string{"x"}, Action: "SCMP_ACT_TRACE"}); err == nil {
		t.Error("an unsupported action was accepted")
	}
}

func TestStrictRefusesWhatDefaultAllows(t *testing.T) {
	dir := profiles
	allowed := func(name string) map[string]bool {
		prof, err := Load(dir, name, []string{"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_BPF", "CAP_PERFMON"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, sc := range prof.Syscalls {
			if sc.Action == specs.ActAllow && len(sc.Args) == 0 {
				for _, n := range sc.Names {
					out[n] = true
				}
			}
		}
		return out
	}
	// Even with every capability, strict allows none of these.
	def, strict := allowed("default"), allowed("strict")
	for _, n := range []string{"ptrace", "process_vm_readv", "bpf", "perf_event_open", "unshare", "setns", "keyctl", "add_key", "io_uring_setup", "userfaultfd"} {
		if strict[n] {
			t.Errorf("strict allows %s", n)
		}
	}
	if !def["ptrace"] || !def["unshare"] {
		t.Error("default (with CAP_SYS_ADMIN) should allow ptrace and unshare: the comparison is void")
	}
}

func TestWithNotify(t *testing.T) {
	prof, err := Load(profiles, "strict", nil)
	if err != nil {
		t.Fatal(err)
	}
	n := WithNotify(prof, "/run/x.sock")
	if n.ListenerPath != "/run/x.sock" {
		t.Errorf("listener path %q", n.ListenerPath)
	}
	notified := map[string]bool{}
	for _, sc := range n.Syscalls {
		for _, name := range sc.Names {
			if sc.Action == specs.ActNotify {
				notified[name] = true
			} else if notified[name] {
				t.Errorf("%s has a notify rule and another", name)
			}
		}
	}
	for _, name := range []string{"unshare", "ptrace", "bpf", "mount", "keyctl"} {
		if !notified[name] {
			t.Errorf("%s is not diagnosed", name)
		}
	}
	for _, name := range []string{"read", "write", "clone", "personality"} {
		if notified[name] {
			t.Errorf("%s (allowed, at least with some arguments) would go to the daemon", name)
		}
	}
	if len(prof.Syscalls) > 0 && prof.ListenerPath != "" {
		t.Error("WithNotify changed its input")
	}
}
