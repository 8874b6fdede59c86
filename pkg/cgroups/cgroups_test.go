package cgroups_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
)

func TestParentLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	if cgroups.HostMode() == cgroups.ModeNone {
		t.Fatal("no cgroup hierarchy")
	}
	parent := "/mcp-sandboxd-cgtest-" + testenv.RandHex(4)
	t.Cleanup(func() { _ = cgroups.Remove(parent) })
	if err := cgroups.EnsureParent(parent); err != nil {
		t.Fatal(err)
	}
	if err := cgroups.EnsureParent(parent); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := cgroups.CheckParent(parent); err != nil {
		t.Fatalf("CheckParent of a fresh parent: %v", err)
	}
	// Dirs names the parent in every hierarchy sandboxes use, and only
	// where it exists.
	dirs := cgroups.Dirs(parent)
	for _, want := range cgroups.HierarchyDirs(parent) {
		if !slices.Contains(dirs, want) {
			t.Errorf("Dirs(%s) = %v, missing %s", parent, dirs, want)
		}
	}
	if d := cgroups.Dirs(parent + "-missing"); len(d) != 0 {
		t.Errorf("Dirs of a missing cgroup = %v", d)
	}
	if err := cgroups.CheckParent(parent + "-missing"); err == nil {
		t.Error("CheckParent of a missing parent succeeded")
	}

	// A child with a process in it: usage is read, Remove kills and removes.
	child := parent + "/sb-test"
	if err := cgroups.EnsureParent(child); err != nil {
		t.Fatal(err)
	}
	if names, err := cgroups.Children(parent); err != nil || !slices.Contains(names, "sb-test") {
		t.Fatalf("Children = %v, %v", names, err)
	}
	sleep, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	// The test is the sleep's parent: reap it as soon as it is killed, as
	// the agent does for the processes of a sandbox.
	reaped := make(chan error, 1)
	go func() { _, err := sleep.Wait(); reaped <- err }()
	t.Cleanup(func() { _ = sleep.Kill(); <-reaped })
	for _, dir := range cgroups.HierarchyDirs(child) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := cgroups.ReadUsage(child)
	if err != nil {
		t.Fatal(err)
	}
	// (Memory is charged where it was allocated, so a task that just moved
	// in may show none on v1.)
	if u.Pids != 1 {
		t.Errorf("usage of a cgroup holding one sleep: %+v", u)
	}
	if procs, err := cgroups.Procs(child); err != nil || !slices.Equal(procs, []int{sleep.Pid}) {
		t.Errorf("Procs = %v, %v; want [%d]", procs, err, sleep.Pid)
	}
	if _, err := cgroups.OOMKills(child); err != nil {
		t.Errorf("OOMKills: %v", err)
	}
	if err := cgroups.Remove(child); err != nil {
		t.Fatal(err)
	}
	if cgroups.Exists(child) || len(cgroups.Dirs(child)) != 0 {
		t.Errorf("child cgroup still exists after Remove: %v", cgroups.Dirs(child))
	}
}

func TestPathsMustBeAbsolute(t *testing.T) {
	for _, p := range []string{"", "/", "relative", "/a/../b", "/a/"} {
		if err := cgroups.CheckPath(p); err == nil {
			t.Errorf("checkPath(%q) = nil", p)
		}
	}
	if err := cgroups.CheckPath("/mcp-sandboxd/sb-1"); err != nil {
		t.Error(err)
	}
}

// TestBlockDeviceOf: a directory on a block device's file system resolves
// to that device's disk, never a partition. The directory is / where / is
// on a block device, else the first mount of a block device (a root on
// overlayfs, as in a container, is not); with none at all the host cannot
// run the test, which SANDBOXD_INTEGRATION=1 turns into a failure.
func TestBlockDeviceOf(t *testing.T) {
	dir := "/"
	dev, err := cgroups.BlockDeviceOf(dir)
	if err != nil {
		dir = blockMount(t)
		if dir == "" {
			testenv.SkipOrFail(t, "no file system on a block device here (/: %v)", err)
		}
		if dev, err = cgroups.BlockDeviceOf(dir); err != nil {
			t.Fatalf("BlockDeviceOf(%s), a mount of a block device: %v", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", dev)); err != nil {
		t.Errorf("BlockDeviceOf(%s) = %s, not a block device: %v", dir, dev, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", dev, "partition")); err == nil {
		t.Errorf("BlockDeviceOf(%s) = %s, a partition, want its disk", dir, dev)
	}
}

// blockMount is the mount point of the first file system in
// /proc/self/mountinfo whose source is a block device ("" if none).
func blockMount(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ID parent major:minor root mountpoint ... - fstype source options
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/dev/block", fields[2])); err == nil {
			return fields[4]
		}
	}
	return ""
}
