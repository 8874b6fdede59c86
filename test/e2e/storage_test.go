package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// memoryStat reads the counters of a sandbox's memory cgroup (v1 names;
// "file" is v2's name for v1's "cache"), nil when the cgroup is gone.
func memoryStat(t *testing.T, d *testenv.Daemon, id string) map[string]uint64 {
	t.Helper()
	var sb struct {
		CgroupPath string `json:"cgroup_path"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &sb); err != nil || sb.CgroupPath == "" {
		t.Fatalf("inspect %s: %+v %v", id, sb, err)
	}
	var path string
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", sb.CgroupPath, "memory.stat"),
		filepath.Join("/sys/fs/cgroup", sb.CgroupPath, "memory.stat"),
	} {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil // the sandbox is gone: callers that need it check
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseUint(v, 10, 64)
		out[k] = n
	}
	if _, ok := out["file"]; !ok {
		out["file"] = out["cache"]
	}
	return out
}

// TestDiskBackedWorkspace is the acceptance test of the disk backing: a
// sandbox with 512M of memory and 1G of disk writes 700 MB to /workspace
// without an OOM kill and with no shmem charged for it; writing past the
// disk fails with ENOSPC inside and leaves the host's image file at its
// size. The same write on the memory backing is killed by the OOM killer,
// which is what the disk backing is for.
func TestDiskBackedWorkspace(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d, "--memory", "512M", "--disk", "1G")
	var sb struct {
		DiskBacking string `json:"disk_backing"`
		Limits      struct {
			Inodes int64 `json:"inodes"`
		} `json:"limits"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.DiskBacking != "disk" || sb.Limits.Inodes != 65536 {
		t.Fatalf("default sandbox: backing %q, %d inodes; want disk, 65536", sb.DiskBacking, sb.Limits.Inodes)
	}

	out, errOut, code := d.Ctl("exec", id, "--", "sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=700 conv=fsync status=none && ls -l /workspace/big")
	if code != 0 || !strings.Contains(out, "734003200") {
		t.Fatalf("writing 700 MB: exit %d, %q %q", code, out, errOut)
	}
	st := memoryStat(t, d, id)
	if st == nil {
		t.Fatalf("no memory.stat for %s", id)
	}
	t.Logf("after 700 MB on disk backing: shmem %d MiB, file %d MiB, rss %d MiB", st["shmem"]>>20, st["file"]>>20, st["rss"]>>20)
	if st["shmem"] > 8<<20 {
		t.Errorf("shmem %d bytes charged to the sandbox for a file on disk", st["shmem"])
	}
	var usage struct {
		Usage struct {
			OOMKills  uint64 `json:"oom_kills"`
			DiskBytes int64  `json:"disk_bytes"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &usage); err != nil {
		t.Fatal(err)
	}
	if usage.Usage.OOMKills != 0 || usage.Usage.DiskBytes < 700<<20 {
		t.Errorf("usage after the write: %+v", usage.Usage)
	}

	// Past the limit: ENOSPC inside.
	out, errOut, code = d.Ctl("exec", id, "--", "sh", "-c", "dd if=/dev/zero of=/workspace/more bs=1M count=500 conv=fsync status=none")
	if code == 0 || !strings.Contains(out+errOut, "No space left on device") {
		t.Fatalf("writing past the disk: exit %d, %q %q; want ENOSPC", code, out, errOut)
	}
	img := filepath.Join(d.Config.Paths.SandboxesDirOrDefault(), id+".img")
	var fst unix.Stat_t
	if err := unix.Stat(img, &fst); err != nil {
		t.Fatal(err)
	}
	if fst.Size != 1<<30 || fst.Blocks*512 > 1<<30 {
		t.Errorf("image file %s: size %d, %d bytes allocated; want at most 1 GiB", img, fst.Size, fst.Blocks*512)
	}

	// Inodes: a small sandbox with 2048 of them cannot make 3000 files.
	small := createSandbox(d, "--inodes", "2048", "--disk", "64M")
	out, errOut, code = d.Ctl("exec", small, "--", "sh", "-c", "cd /workspace && i=0; while [ $i -lt 3000 ]; do : > f$i || exit 7; i=$((i+1)); done")
	if code == 0 || !strings.Contains(out+errOut, "No space left on device") {
		t.Fatalf("3000 files with 2048 inodes: exit %d, %q %q; want ENOSPC", code, out, errOut)
	}

	// The memory backing: the same write is charged as shmem and OOM-killed.
	mem := createSandbox(d, "--memory", "512M", "--disk", "1G", "--disk-backing", "memory")
	_, _, code = d.Ctl("exec", mem, "--", "sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=700 status=none")
	if code == 0 {
		t.Errorf("700 MB to a tmpfs under a 512M memory limit succeeded")
	}
	// Killing dd frees none of the tmpfs's pages, so the OOM killer may go
	// on to the sandbox's init: then the sandbox (and its cgroup) is gone.
	if stm := memoryStat(t, d, mem); stm != nil {
		t.Logf("after the 700 MB write on memory backing: exit %d, shmem %d MiB, file %d MiB", code, stm["shmem"]>>20, stm["file"]>>20)
	} else {
		t.Logf("after the 700 MB write on memory backing: exit %d, sandbox %s (the OOM killer took its init)", code, sandboxState(t, d, mem))
	}

	_, errOut, code = d.Ctl("create", "--lang", "shell", "--disk-backing", "floppy")
	if code == 0 || !strings.Contains(errOut, "disk_backing") || !strings.Contains(errOut, "floppy") {
		t.Errorf("disk_backing floppy: exit %d, %q; want invalid_argument naming the field", code, errOut)
	}
}

// TestCrashWithSandboxesUp kills the daemon with five disk-backed
// sandboxes up, restarts it (they are adopted), terminates them and runs
// gc: no loop device, mount or image file of theirs is left.
func TestCrashWithSandboxesUp(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	var ids []string
	for range 5 {
		id := createSandbox(d)
		d.MustCtl("exec", id, "--", "sh", "-c", "echo kept > /workspace/f")
		ids = append(ids, id)
	}
	devs := loopDevicesOf(t, d)
	if len(devs) != 5 {
		t.Fatalf("loop devices of 5 sandboxes: %v", devs)
	}
	d.Crash()
	d.Start()
	for _, id := range ids {
		if got := d.MustCtl("exec", id, "--", "cat", "/workspace/f"); got != "kept\n" {
			t.Fatalf("%s after restart: %q", id, got)
		}
		d.MustCtl("rm", id)
	}
	d.MustCtl("gc")
	testenv.AssertNoLeftovers(t, d.Config)
	if devs := loopDevicesOf(t, d); len(devs) != 0 {
		t.Fatalf("loop devices left: %v", devs)
	}
}

func loopDevicesOf(t *testing.T, d *testenv.Daemon) []string {
	t.Helper()
	out, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	dir := d.Config.Paths.SandboxesDirOrDefault()
	var devs []string
	for _, e := range out {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop/backing_file"))
		// Sandboxes' images only, not the pool's ready disks (dir/pool/).
		if err == nil && filepath.Dir(strings.TrimSpace(string(b))) == dir {
			devs = append(devs, e.Name())
		}
	}
	return devs
}

// TestPausedAcrossRestart: a paused sandbox stays paused (and frozen) across
// a daemon crash, refuses commands, and resumes afterwards.
func TestPausedAcrossRestart(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	if out := d.MustCtl("pause", id); out != id+" paused\n" {
		t.Fatalf("pause: %q", out)
	}
	d.Crash()
	d.Start()
	if s := sandboxState(t, d, id); s != "paused" {
		t.Fatalf("paused sandbox after restart: %s", s)
	}
	var sb struct {
		CgroupPath string `json:"cgroup_path"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &sb); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/freezer", sb.CgroupPath, "freezer.state"),
		filepath.Join("/sys/fs/cgroup", sb.CgroupPath, "cgroup.freeze"),
	} {
		if b, err := os.ReadFile(f); err == nil {
			if s := strings.TrimSpace(string(b)); s != "FROZEN" && s != "1" {
				t.Errorf("%s = %q after restart, want frozen", f, s)
			}
		}
	}
	if _, errOut, code := d.Ctl("exec", id, "--", "true"); code == 0 || !strings.Contains(errOut, "paused") {
		t.Errorf("exec in a paused sandbox: exit %d %q, want a conflict naming the state", code, errOut)
	}
	if out := d.MustCtl("resume", id); out != id+" ready\n" {
		t.Fatalf("resume: %q", out)
	}
	if got := d.MustCtl("exec", id, "--", "echo", "thawed"); got != "thawed\n" {
		t.Fatalf("exec after resume: %q", got)
	}
}
