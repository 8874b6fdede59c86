package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// switchProgram prints, exits and writes output files by which side of
// the instant SWITCH_AT (unix seconds, from its env) it runs on: a
// nondeterminism the test controls, independent of the image. same.txt
// and the first line never change.
const switchProgram = `import os, sys, time
after = time.time() >= float(os.environ["SWITCH_AT"])
side = "after" if after else "before"
print("common line")
print(side)
print("err " + side, file=sys.stderr)
os.makedirs("output", exist_ok=True)
open("output/result.txt", "w").write("state=" + side + "\n")
open("output/same.txt", "w").write("unchanged\n")
open("output/blob.bin", "wb").write(bytes([0, 1 if after else 2, 255]))
sys.exit(3 if after else 0)
`

// privateImages gives daemon d an image store of its own holding the
// shared cache's current shell and python images (hard links: the trees
// are read-only lower layers), so that the test may remove one.
func privateImages(t *testing.T, d *testenv.Daemon) string {
	t.Helper()
	imgs := testenv.EnsureImages(t, "shell", "python")
	dir := filepath.Join(t.TempDir(), "images")
	if err := os.MkdirAll(filepath.Join(dir, "by-name"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, img := range imgs {
		if out, err := exec.Command("cp", "-al", filepath.Dir(img.Rootfs), filepath.Join(dir, img.Digest)).CombinedOutput(); err != nil {
			t.Fatalf("link image %s: %v: %s", name, err, out)
		}
		if err := os.Symlink(filepath.Join("..", img.Digest), filepath.Join(dir, "by-name", name)); err != nil {
			t.Fatal(err)
		}
	}
	d.Config.Paths.ImagesDir = dir
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRunReplay: a run whose behaviour changed (it reads the clock against
// an instant the test puts between the original and the replay) replays
// with the exact diff of exit code, stdout, stderr and output files; a
// deterministic run replays the same; through the CLI, REST and MCP. An
// unknown run is not_found, another tenant's run is not_found word for
// word, and a run whose image digest is gone is failed_precondition
// naming the digest.
func TestRunReplay(t *testing.T) {
	d := testenv.NewDaemon(t)
	imgDir := privateImages(t, d)
	d.Start()
	_, aliceKey := keyOf(t, d, "alice")
	_, bobKey := keyOf(t, d, "bob")
	alice := newTenantClient(t, d, aliceKey, "")
	bob := newTenantClient(t, d, bobKey, "")

	// The original must run before SWITCH_AT: the margin is a multiple of
	// a measured run on this host, doubled until the original says
	// "before" (a busy host can stall one run far beyond the others).
	start := time.Now()
	var warm apitypes.RunResult
	if st, b := alice.do("POST", "/v1/run", map[string]any{"language": "python", "code": "print('warm')"}); st != http.StatusOK || json.Unmarshal(b, &warm) != nil || !warm.Success {
		t.Fatalf("warm-up run: %d %s", st, b)
	}
	margin := 3*time.Since(start) + 2*time.Second
	var orig apitypes.RunResult
	var switchAt time.Time
	for try := 0; ; try++ {
		switchAt = time.Now().Add(margin)
		st, b := alice.do("POST", "/v1/run", map[string]any{"language": "python", "code": switchProgram,
			"env": map[string]string{"SWITCH_AT": fmt.Sprintf("%.3f", float64(switchAt.UnixMilli())/1000)}, "memory_mb": 256})
		if st != http.StatusOK || json.Unmarshal(b, &orig) != nil {
			t.Fatalf("original run: %d %s", st, b)
		}
		if orig.ExitCode == 0 && strings.Contains(orig.Stdout, "before") {
			break
		}
		if try == 3 {
			t.Fatalf("the original never ran before its switch (margin %v): %+v", margin, orig)
		}
		margin *= 2
	}
	time.Sleep(time.Until(switchAt) + 100*time.Millisecond)

	// CLI over the socket (admin): exit 1 because the runs differ, the
	// diff printed.
	out, stderr, code := d.Ctl("runs", "replay", orig.RunID)
	if code != 1 {
		t.Fatalf("sandboxctl runs replay: exit %d, want 1\n%s%s", code, out, stderr)
	}
	wantLines := []string{
		"exit code  0 -> 3",
		"--- original/stdout\n+++ replay/stdout\n@@ -1,2 +1,2 @@\n common line\n-before\n+after\n",
		"--- original/stderr\n+++ replay/stderr\n@@ -1 +1 @@\n-err before\n+err after\n",
		"--- original/output/result.txt\n+++ replay/output/result.txt\n@@ -1 +1 @@\n-state=before\n+state=after\n",
		"output     blob.bin changed (binary): 3 bytes sha256:",
	}
	for _, w := range wantLines {
		if !strings.Contains(out, w) {
			t.Errorf("sandboxctl runs replay: no %q in\n%s", w, out)
		}
	}

	// REST as alice: the same diff, exactly, and a new record linked to
	// the original.
	var rep apitypes.RunReplay
	st, b := alice.do("POST", "/v1/runs/"+orig.RunID+"/replay", nil)
	if st != http.StatusOK || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("REST replay: %d %s", st, b)
	}
	dd := rep.Diff
	if dd.Same || dd.ExitCode == nil || *dd.ExitCode != (apitypes.ExitCodeDiff{Original: 0, Replay: 3}) ||
		dd.Stdout != "--- original/stdout\n+++ replay/stdout\n@@ -1,2 +1,2 @@\n common line\n-before\n+after\n" ||
		dd.Stderr != "--- original/stderr\n+++ replay/stderr\n@@ -1 +1 @@\n-err before\n+err after\n" {
		t.Fatalf("REST replay diff: %+v", dd)
	}
	if len(dd.Files) != 2 || dd.Files[0].Path != "blob.bin" || !dd.Files[0].Binary || dd.Files[0].Change != "changed" ||
		*dd.Files[0].OriginalSize != 3 || *dd.Files[0].ReplaySize != 3 || dd.Files[0].OriginalSHA256 == dd.Files[0].ReplaySHA256 ||
		dd.Files[1].Path != "result.txt" || dd.Files[1].Binary ||
		dd.Files[1].Diff != "--- original/output/result.txt\n+++ replay/output/result.txt\n@@ -1 +1 @@\n-state=before\n+state=after\n" {
		t.Fatalf("REST replay files: %+v", dd.Files)
	}
	if rep.Original != orig.RunID || rep.Replay.RunID == orig.RunID || rep.Replay.ExitCode != 3 || rep.Replay.SandboxID == orig.SandboxID || rep.Note != "" {
		t.Fatalf("REST replay: %+v", rep)
	}
	var rec apitypes.RunRecord
	if st, b := alice.do("GET", "/v1/runs/"+rep.Replay.RunID, nil); st != http.StatusOK || json.Unmarshal(b, &rec) != nil ||
		rec.Metadata.ReplayOf != orig.RunID || rec.Metadata.Tenant != "alice" {
		t.Fatalf("replay's record: %d %s", st, b)
	}
	var origRec apitypes.RunRecord
	if st, b := alice.do("GET", "/v1/runs/"+orig.RunID, nil); st != http.StatusOK || json.Unmarshal(b, &origRec) != nil ||
		rec.Metadata.ImageDigest != origRec.Metadata.ImageDigest || rec.Metadata.ImageDigest == "" {
		t.Fatalf("replay ran on %q, the original on %q", rec.Metadata.ImageDigest, origRec.Metadata.ImageDigest)
	}

	// A deterministic run replays the same, over MCP.
	var same apitypes.RunResult
	if st, b := alice.do("POST", "/v1/run", map[string]any{"language": "python", "code": "import sys\nprint(sys.argv[1:])\nprint(input())\nopen('output/o.txt','w').write('x')\n",
		"args": []string{"a", "b"}, "stdin": "from stdin\n", "files": map[string]string{"output/.keep": ""}}); st != http.StatusOK || json.Unmarshal(b, &same) != nil || !same.Success {
		t.Fatalf("deterministic run: %d %s", st, b)
	}
	alice.mcpInit()
	sc, errText := alice.tool("run_replay", map[string]any{"run_id": same.RunID})
	if errText != "" {
		t.Fatalf("run_replay: %s", errText)
	}
	var mrep apitypes.RunReplay
	if raw, _ := json.Marshal(sc); json.Unmarshal(raw, &mrep) != nil || !mrep.Diff.Same || mrep.Diff.Stdout != "" || len(mrep.Diff.Files) != 0 ||
		mrep.Replay.Stdout != "['a', 'b']\nfrom stdin\n" || mrep.Original != same.RunID {
		t.Fatalf("run_replay of a deterministic run: %+v", sc)
	}

	// Errors: an unknown run; bob replaying alice's run is told the same;
	// a malformed id.
	const missing = "20000101_000000_abcd"
	_, b = alice.do("POST", "/v1/runs/"+missing+"/replay", nil)
	unknown := alice.wantErr("replay unknown", 404, b, "not_found")
	_, b = bob.do("POST", "/v1/runs/"+orig.RunID+"/replay", nil)
	if got := bob.wantErr("bob replays alice's run", 404, b, "not_found"); strings.ReplaceAll(got, orig.RunID, missing) != unknown {
		t.Errorf("another tenant's run: %q, an unknown one: %q", got, unknown)
	}
	_, b = alice.do("POST", "/v1/runs/..%2fx/replay", nil)
	alice.wantErr("replay malformed", 400, b, "invalid_argument")

	// The image the original ran on is gone (rebuilt and pruned): the
	// replay is refused, naming the digest.
	digest := origRec.Metadata.ImageDigest
	if err := os.Remove(filepath.Join(imgDir, "by-name", "python")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(imgDir, digest)); err != nil {
		t.Fatal(err)
	}
	_, b = alice.do("POST", "/v1/runs/"+orig.RunID+"/replay", nil)
	if msg := alice.wantErr("replay on a gone digest", 412, b, "failed_precondition"); !strings.Contains(msg, digest) {
		t.Errorf("gone digest: %q does not name %s", msg, digest)
	}
}
