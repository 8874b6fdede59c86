package cgroups

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

func TestParentLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	if HostMode() == ModeNone {
		t.Fatal("no cgroup hierarchy")
	}
	parent := "/mcp-sandboxd-cgtest-" + testenv.RandHex(4)
	t.Cleanup(func() { _ = Remove(parent) })
	if err := EnsureParent(parent); err != nil {
		t.Fatal(err)
	}
	if err := EnsureParent(parent); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := CheckParent(parent); err != nil {
		t.Fatalf("CheckParent of a fresh parent: %v", err)
	}
	if err := CheckParent(parent + "-missing"); err == nil {
		t.Error("CheckParent of a missing parent succeeded")
	}

	// A child with a process in it: usage is read, Remove kills and removes.
	child := parent + "/sb-test"
	if err := EnsureParent(child); err != nil {
		t.Fatal(err)
	}
	if names, err := Children(parent); err != nil || !slices.Contains(names, "sb-test") {
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
	for _, dir := range hierarchyDirs(child) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := ReadUsage(child)
	if err != nil {
		t.Fatal(err)
	}
	// (Memory is charged where it was allocated, so a task that just moved
	// in may show none on v1.)
	if u.Pids != 1 {
		t.Errorf("usage of a cgroup holding one sleep: %+v", u)
	}
	if procs, err := Procs(child); err != nil || !slices.Equal(procs, []int{sleep.Pid}) {
		t.Errorf("Procs = %v, %v; want [%d]", procs, err, sleep.Pid)
	}
	if _, err := OOMKills(child); err != nil {
		t.Errorf("OOMKills: %v", err)
	}
	if err := Remove(child); err != nil {
		t.Fatal(err)
	}
	if Exists(child) {
		t.Error("child cgroup still exists after Remove")
	}
}

func TestPathsMustBeAbsolute(t *testing.T) {
	for _, p := range []string{"", "/", "relative", "/a/../b", "/a/"} {
		if err := checkPath(p); err == nil {
			t.Errorf("checkPath(%q) = nil", p)
		}
	}
	if err := checkPath("/mcp-sandboxd/sb-1"); err != nil {
		t.Error(err)
	}
}

func TestBlockDeviceOf(t *testing.T) {
	dev, err := BlockDeviceOf("/")
	if err != nil {
		t.Skipf("/ is not on a block device here: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", dev)); err != nil {
		t.Errorf("BlockDeviceOf(/) = %s, not a block device: %v", dev, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", dev, "partition")); err == nil {
		t.Errorf("BlockDeviceOf(/) = %s, a partition, want its disk", dev)
	}
}
