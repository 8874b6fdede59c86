package volumes

import (
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestCheckPath: mount paths that would hide what the kernel or the daemon
// gives a sandbox, or that are not plain absolute paths, are refused with
// invalid_argument naming the field; ordinary data paths pass.
func TestCheckPath(t *testing.T) {
	for _, p := range []string{"/data", "/workspace/cache", "/tmp/x", "/home/user/.cache", "/mnt/a/b", "/opt/tools", "/var/lib/x", "/etc-like"} {
		if err := CheckPath("path", p); err != nil {
			t.Errorf("CheckPath(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", "/", "data", "./data", "/data/", "/data//x", "/data/../proc", "/a/./b", "/proc", "/proc/sys",
		"/sys", "/sys/fs/cgroup", "/dev", "/dev/shm", "/.sandboxd", "/.sandboxd/run", "/etc", "/usr", "/workspace", "/tmp",
		"/bin", "/lib64", "/da\nta", "/da\x00ta", "/" + strings.Repeat("a", 1100)} {
		err := CheckPath("volumes[0].path", p)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "volumes[0].path") {
			t.Errorf("CheckPath(%q) = %v, want invalid_argument naming volumes[0].path", p, err)
		}
	}
}

// TestCheckName: a volume name is a DNS label; anything that could be a
// path or an option is refused.
func TestCheckName(t *testing.T) {
	for _, n := range []string{"a", "cache", "my-vol-2", strings.Repeat("a", 63)} {
		if err := CheckName("name", n); err != nil {
			t.Errorf("CheckName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", "-a", "a-", "A", "a.b", "a/b", "..", "a b", "a\x00", strings.Repeat("a", 64), "vol_1"} {
		if err := CheckName("name", n); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "name") {
			t.Errorf("CheckName(%q) = %v, want invalid_argument", n, err)
		}
	}
}
