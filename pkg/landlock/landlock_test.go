package landlock

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

func TestPathFlagForm(t *testing.T) {
	for _, p := range []Path{
		{Path: "/"},
		{Path: "/workspace", Writable: true, Exec: true},
		{Path: "/dev/pts", Writable: true, Dev: true},
		{Path: "/a b:c", Exec: true},
		{Path: "/sys/fs/cgroup", Tree: true},
	} {
		got, err := ParsePath(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePath(%q) = %+v, %v; want %+v", p.String(), got, err, p)
		}
	}
	for _, bad := range []string{"", "/x", "rw:x", "rw:/x/../y", "rw,suid:/x", "exec:/x", "rw,rw:/x", "rx:/x"} {
		if _, err := ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) took it", bad)
		}
	}
}

// TestPlanSplitsAroundHoles checks the rules made around an undeclared
// mount point: none covers it, everything beside it keeps its rule, files
// get file rights only and symlinks none.
func TestPlanSplitsAroundHoles(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a/leak/inner", "a/sib", "b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a/file", "top"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a/leak", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	decl := []Path{{Path: root, Writable: true, Exec: true}, {Path: filepath.Join(root, "b"), Dev: true}}
	hole := filepath.Join(root, "a/leak")
	rules, err := plan(decl, []string{hole}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, r := range rules {
		got[strings.TrimPrefix(r.path, root)] |= uint64(r.access)
	}
	rw := uint64(decl[0].access())
	want := map[string]uint64{
		"/a/sib":  rw,
		"/a/file": rw & uint64(fileFS),
		"/b":      rw | uint64(decl[1].access()), // beside the hole, and declared itself
		"/top":    rw & uint64(fileFS),
	}
	for p, a := range want {
		if got[p] != a {
			t.Errorf("rule of %s: %#x, want %#x", p, got[p], a)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected rule on %q (rules on the root, a, the hole or a symlink would cover the hole)", p)
		}
	}

	// Under procfs a split would miss every process started later.
	mounts := []*mountinfo.Info{{Mountpoint: root, FSType: "proc"}}
	if _, err := plan(decl[:1], []string{hole}, mounts); err == nil || !strings.Contains(err.Error(), "a/leak") {
		t.Errorf("a hole under procfs: %v, want a refusal naming it", err)
	}
}

func TestUndeclared(t *testing.T) {
	mounts := []*mountinfo.Info{{Mountpoint: "/"}, {Mountpoint: "/proc"}, {Mountpoint: "/mnt/x"}, {Mountpoint: "/dev"}, {Mountpoint: "/mnt/x"}}
	mounts = append(mounts, &mountinfo.Info{Mountpoint: "/sys/fs/cgroup/memory"}, &mountinfo.Info{Mountpoint: "/sys/fs/cgroupx"})
	got := undeclared([]Path{{Path: "/"}, {Path: "/proc"}, {Path: "/dev"}, {Path: "/sys/fs/cgroup", Tree: true}}, mounts)
	if !slices.Equal(got, []string{"/mnt/x", "/sys/fs/cgroupx"}) {
		t.Errorf("undeclared = %v", got)
	}
}

func TestDetect(t *testing.T) {
	s, err := Detect(ModeOff)
	if err != nil || s.Enforce || s.Reason == "" {
		t.Errorf("off: %+v %v", s, err)
	}
	s, err = Detect(ModeAuto)
	if err != nil || s.Enforce != (s.ABI >= MinABI) {
		t.Errorf("auto: %+v %v", s, err)
	}
	if _, err := Detect(ModeRequire); (err == nil) != (ABI() >= MinABI) {
		t.Errorf("require on ABI %d: %v", ABI(), err)
	}
}
