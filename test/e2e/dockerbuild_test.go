package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestImagesBuildCLI drives a Dockerfile build the way a user does:
// sandboxctl images build -f Dockerfile -t NAME --build-arg K=V DIR
// uploads DIR as the context (REST, NDJSON progress on stderr); a sandbox
// from the tag runs as the USER in the WORKDIR with the ENV and the files
// of COPY and RUN; the rebuild runs no step; a context with a symlink
// leading out is refused naming the entry; a bad Dockerfile names its line.
func TestImagesBuildCLI(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Config.Paths.ImagesDir = testenv.SeedImages(t, "shell")
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()

	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("src/run.sh", "#!/bin/sh\necho run by $(id -un) in $(pwd): $FLAVOUR\n", 0o755)
	write("Dockerfile", `FROM shell
USER root
ARG FLAVOUR=plain
ENV FLAVOUR=$FLAVOUR
RUN useradd -m -u 1500 cli && echo "$FLAVOUR" > /etc/flavour
WORKDIR /opt/cli
COPY src/ bin/
USER cli
`, 0o644)
	build := func(args ...string) (string, string, int) {
		return d.Ctl(append([]string{"--json", "images", "build", "-f", filepath.Join(dir, "Dockerfile"), "-t", "cliapp", "--build-arg", "FLAVOUR=mint"}, args...)...)
	}
	out, errOut, code := build(dir)
	if code != 0 {
		t.Fatalf("images build: exit %d: %s", code, errOut)
	}
	var img apitypes.Image
	if err := json.Unmarshal([]byte(out), &img); err != nil {
		t.Fatalf("images build output %q: %v", out, err)
	}
	if img.Name != "cliapp" || !strings.Contains(errOut, "step 5/8: RUN useradd") || strings.Contains(errOut, "(cached)") {
		t.Errorf("images build: %+v; stderr %s", img, errOut)
	}
	id := strings.TrimSpace(d.MustCtl("create", "--image", "cliapp"))
	if out := d.MustCtl("exec", id, "--", "sh", "-c", "bin/run.sh; cat /etc/flavour"); out != "run by cli in /opt/cli: mint\nmint\n" {
		t.Errorf("exec in the built image: %q", out)
	}

	// Again: every layer step cached, the same image.
	out, errOut, code = build(dir)
	var again apitypes.Image
	if code != 0 || json.Unmarshal([]byte(out), &again) != nil || again.Digest != img.Digest ||
		!strings.Contains(errOut, "RUN useradd -m -u 1500 cli && echo \"$FLAVOUR\" > /etc/flavour (cached)") || !strings.Contains(errOut, "COPY src/ bin/ (cached)") {
		t.Errorf("rebuild: exit %d %s; stderr %s", code, out, errOut)
	}

	// A context with a symlink leading out: refused, the entry named.
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "src", "shadow")); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code = build(dir); code == 0 || !strings.Contains(errOut, `entry "src/shadow": symlink to "/etc/shadow" leads out of the context`) {
		t.Errorf("context with a symlink out: exit %d: %s", code, errOut)
	}
	os.Remove(filepath.Join(dir, "src", "shadow"))

	// A bad Dockerfile: its line named.
	write("Dockerfile", "FROM shell\nHEALTHCHECK CMD true\n", 0o644)
	if _, errOut, code = d.Ctl("images", "build", "-f", filepath.Join(dir, "Dockerfile"), dir); code == 0 || !strings.Contains(errOut, "line 2: HEALTHCHECK is refused") {
		t.Errorf("bad Dockerfile: exit %d: %s", code, errOut)
	}
}
