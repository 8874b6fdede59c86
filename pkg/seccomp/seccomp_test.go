package seccomp

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
