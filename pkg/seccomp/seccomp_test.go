package seccomp

import (
	"errors"
	"path/filepath"
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

func TestCheck(t *testing.T) {
	s := Check()
	if s.OK() != (s.Build && s.Kernel) || (s.OK() && s.Reason != "") || (!s.OK() && s.Reason == "") {
		t.Errorf("inconsistent support report %+v", s)
	}
}
