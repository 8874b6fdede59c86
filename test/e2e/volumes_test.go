package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/crashpoint"
	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/volumes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/storage"
)

// TestVolumeSurvivesKill: a volume written by one sandbox is read by the
// next after the first is terminated and the daemon killed with SIGKILL
// and restarted, through sandboxctl as an administrator does; gc leaves it
// alone, delete is refused while a sandbox mounts it (exit 1, naming the
// sandbox) and leaves nothing once allowed.
func TestVolumeSurvivesKill(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	if out := d.MustCtl("volumes", "create", "keep", "--size", "64M"); out != "keep\n" {
		t.Fatalf("volumes create: %q", out)
	}
	first := createSandbox(d, "--volume", "keep:/data")
	d.MustCtl("exec", first, "--", "sh", "-c", "echo written-before-the-kill > /data/f && sync")
	d.MustCtl("rm", first)
	d.Crash()
	d.Start()
	d.MustCtl("gc")
	next := createSandbox(d, "--volume", "keep:/mnt/keep:ro")
	if got := d.MustCtl("exec", next, "--", "cat", "/mnt/keep/f"); got != "written-before-the-kill\n" {
		t.Fatalf("the next sandbox reads %q", got)
	}
	// A kill with a sandbox mounting it: after the restart it is adopted
	// with the volume still there.
	d.Crash()
	d.Start()
	if got := d.MustCtl("exec", next, "--", "cat", "/mnt/keep/f"); got != "written-before-the-kill\n" {
		t.Fatalf("the adopted sandbox reads %q", got)
	}
	_, errOut, code := d.Ctl("volumes", "rm", "keep")
	if code != 1 || !strings.Contains(errOut, "failed_precondition") || !strings.Contains(errOut, next) {
		t.Fatalf("volumes rm while mounted: exit %d, %q; want 1, failed_precondition naming %s", code, errOut, next)
	}
	var v struct {
		UsedBy    []string `json:"used_by"`
		UsedBytes int64    `json:"used_bytes"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("volumes", "inspect", "keep")), &v); err != nil || len(v.UsedBy) != 1 || v.UsedBy[0] != next {
		t.Fatalf("volumes inspect: %+v, %v", v, err)
	}
	d.MustCtl("rm", next)
	if out := d.MustCtl("volumes", "rm", "keep"); out != "keep\n" {
		t.Fatalf("volumes rm: %q", out)
	}
	if out := d.MustCtl("volumes", "ls", "--json"); !strings.Contains(out, `"volumes": []`) {
		t.Errorf("volumes ls after rm: %s", out)
	}
	assertNoVolume(t, d, "keep")
}

// TestVolumeCrashAtEveryStep kills the daemon after each step of a
// volume's create in turn and restarts it: the unacknowledged volume is
// gone, with its image, loop device, mount and ledger rows, and the name
// can be created again.
func TestVolumeCrashAtEveryStep(t *testing.T) {
	for _, point := range []string{volumes.CrashAfterRow, volumes.CrashAfterImage, volumes.CrashAfterMount} {
		t.Run(point, func(t *testing.T) {
			d := testenv.NewDaemon(t)
			d.ExtraEnv = []string{crashpoint.EnvVar + "=" + point}
			d.Start()
			if out, _, code := d.Ctl("volumes", "create", "half", "--size", "32M"); code == 0 {
				t.Fatalf("create succeeded (%q) although the daemon was to crash at %s", out, point)
			}
			if err := d.WaitExited(30 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("daemon exit: %v, want killed by its crash point", err)
			}
			d.ExtraEnv = nil
			d.Start()
			if out := d.MustCtl("volumes", "ls", "--json"); !strings.Contains(out, `"volumes": []`) {
				t.Fatalf("volumes after restart: %s, want none", out)
			}
			assertNoVolume(t, d, "half")
			d.MustCtl("volumes", "create", "half", "--size", "32M")
			d.MustCtl("volumes", "rm", "half")
			assertNoVolume(t, d, "half")
		})
	}
}

// assertNoVolume checks that nothing of volume name is on the host: its
// image, a loop device backed by it, its mount point. Its files are named
// by its storage name: the name (volumes made before names were per
// tenant) or the name, a dot and a random suffix.
func assertNoVolume(t *testing.T, d *testenv.Daemon, name string) {
	t.Helper()
	dir := filepath.Join(d.Config.Volumes.DirOrDefault(d.Config.Paths.StateDir))
	imgs, _ := filepath.Glob(filepath.Join(dir, name+".*.img"))
	imgs = append(imgs, filepath.Join(dir, name+".img"))
	for _, img := range imgs {
		if _, err := os.Stat(img); !os.IsNotExist(err) {
			t.Errorf("image %s: %v", img, err)
		}
	}
	devs, err := storage.LoopDevices()
	if err != nil {
		t.Fatal(err)
	}
	for dev, backing := range devs {
		if b := filepath.Base(backing); filepath.Dir(backing) == dir && (b == name+".img" || strings.HasPrefix(b, name+".")) {
			t.Errorf("loop device %s of %s left", dev, backing)
		}
	}
	mps, _ := filepath.Glob(filepath.Join(d.Config.Paths.RunDir, "volumes", name+".*"))
	mps = append(mps, filepath.Join(d.Config.Paths.RunDir, "volumes", name))
	for _, mp := range mps {
		if _, err := os.Stat(mp); !os.IsNotExist(err) {
			t.Errorf("mount point %s of %s: %v", mp, name, err)
		}
	}
	testenv.AssertNoLeftovers(t, d.Config)
}

// TestTemplateCLI: an administrator makes a template whose start command
// serves HTTP, with a warm pool, through sandboxctl; create --template
// prints a sandbox whose port already answers (asked from inside it right
// away, no waiting), and the template survives a kill -9 with its pool.
func TestTemplateCLI(t *testing.T) {
	d := testenv.NewDaemon(t, "python")
	d.Start()
	d.MustCtl("templates", "create", "web", "--image", "python", "--start", "cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1",
		"--ready-port", "8000", "--pool", "1", "--memory", "256M")
	probe := []string{"python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/', timeout=5).status)"}
	id := strings.TrimSpace(d.MustCtl("create", "--template", "web"))
	if got := d.MustCtl(append([]string{"exec", id, "--"}, probe...)...); got != "200\n" {
		t.Fatalf("port 8000 of a template sandbox: %q", got)
	}
	var sb struct {
		Template string `json:"template"`
		State    string `json:"state"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("inspect", "--json", id)), &sb); err != nil || sb.Template != "web" {
		t.Fatalf("inspect: %+v, %v", sb, err)
	}
	d.MustCtl("rm", "-f", id) // its start command runs: -f
	d.Crash()
	d.Start()
	var tpl struct {
		Name string `json:"name"`
		Pool int    `json:"pool"`
	}
	if err := json.Unmarshal([]byte(d.MustCtl("templates", "inspect", "web")), &tpl); err != nil || tpl.Name != "web" || tpl.Pool != 1 {
		t.Fatalf("template after kill -9: %+v, %v", tpl, err)
	}
	id = strings.TrimSpace(d.MustCtl("create", "--template", "web"))
	if got := d.MustCtl(append([]string{"exec", id, "--"}, probe...)...); got != "200\n" {
		t.Fatalf("port 8000 after the restart: %q", got)
	}
	if _, errOut, code := d.Ctl("create", "--template", "nosuch"); code != 3 || !strings.Contains(errOut, "template:") {
		t.Errorf("create --template nosuch: exit %d %q, want 3 naming template", code, errOut)
	}
	d.MustCtl("rm", "-f", id) // its start command runs: -f
	d.MustCtl("templates", "rm", "web")
	if out := d.MustCtl("templates", "ls", "--json"); !strings.Contains(out, `"templates": []`) {
		t.Errorf("templates after rm: %s", out)
	}
}
