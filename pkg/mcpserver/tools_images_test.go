package mcpserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// privateShellStore is an image store of the test's own holding the shared
// cache's shell image — hard links of its files (the test deletes it; the
// shared cache stays whole: removing a link leaves the other) — whose
// current image is a fabricated older build of the shell recipe, so that
// shell is out of date. It returns the store and the real shell digest.
func privateShellStore(t *testing.T) (string, string) {
	t.Helper()
	shared := testenv.EnsureImages(t, "shell")["shell"]
	dir, err := os.MkdirTemp(filepath.Dir(testenv.ImagesDir()), "mcp-images-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if out, err := exec.Command("cp", "-al", filepath.Dir(shared.Rootfs), filepath.Join(dir, shared.Digest)).CombinedOutput(); err != nil {
		t.Fatalf("link image: %v %s", err, out)
	}
	testenv.SetCurrentImage(t, dir, "shell", testenv.FakeImageVersion(t, dir, shared.Digest, "an older shell"))
	return dir, shared.Digest
}

func findImage(l imageListOut, name string) *apitypes.Image {
	for i := range l.Images {
		if l.Images[i].Name == name {
			return &l.Images[i]
		}
	}
	return nil
}

func unbuilt(l imageListOut, name string, vm bool) bool {
	return slices.ContainsFunc(l.Unbuilt, func(r apitypes.ImageRecipe) bool { return r.Name == name && r.VM == vm })
}

// TestImageTools: image_list shows an out-of-date image and what is not
// built; image_build makes it current (its log line arriving as progress)
// and returns at once when it is up to date; image_delete is refused while
// a sandbox runs on the image and then deletes it.
func TestImageTools(t *testing.T) {
	testenv.RequireRoot(t) // before the private store, which links the shared cache's files
	store, digest := privateShellStore(t)
	e := newEngine(t, func(c *config.Config) { c.Paths.ImagesDir = store })
	c := newClient(t, e, Options{})

	res := c.call("image_list", map[string]any{}, nil)
	var l imageListOut
	decodeStructured(t, res, &l)
	if txt := text(res); !strings.HasPrefix(txt, "1 images built: shell\nout of date: shell\nin use: none\nnot built: ") {
		t.Errorf("image_list text part = %q", txt)
	}
	sh := findImage(l, "shell")
	if sh == nil || sh.Recipe != "shell" || sh.VM || sh.UpToDate == nil || *sh.UpToDate || sh.Digest == digest || sh.InUse != 0 {
		t.Fatalf("image_list shell = %+v, want the fabricated out-of-date build", sh)
	}
	if len(l.Images) != 1 || !unbuilt(l, "python", false) || !unbuilt(l, "linux", true) || !unbuilt(l, "python", true) || unbuilt(l, "shell", false) {
		t.Errorf("image_list = %+v, want shell built and python, linux (vm), python (vm) unbuilt", l)
	}
	for _, r := range l.Unbuilt {
		if r.Name == "python" && !r.VM && (!r.Language || r.Description == "") {
			t.Errorf("unbuilt python = %+v", r)
		}
	}

	// The shell tree of the current recipe is in the store: image_build
	// makes it current again without building, and logs that.
	res = c.call("image_build", map[string]any{"name": "shell"}, &mcp.Meta{ProgressToken: "b1"})
	if res.IsError {
		t.Fatal(text(res))
	}
	var img apitypes.Image
	decodeStructured(t, res, &img)
	if img.Name != "shell" || img.Digest != digest || img.UpToDate == nil || !*img.UpToDate || img.SizeBytes == 0 || !strings.Contains(text(res), "up to date") {
		t.Fatalf("image_build shell = %+v %q", img, text(res))
	}
	var log strings.Builder
	for _, n := range c.notifications() {
		if n.Method == "notifications/progress" && n.Params.AdditionalFields["progressToken"] == "b1" {
			m, _ := n.Params.AdditionalFields["message"].(string)
			log.WriteString(m)
		}
	}
	if !strings.Contains(log.String(), "image shell: image "+digest[:12]+" is up to date") {
		t.Errorf("progress of image_build = %q, want the build log's up-to-date line", log.String())
	}
	t.Logf("image_build progress: %q", log.String())
	start := time.Now()
	if again := ok[apitypes.Image](c, "image_build", map[string]any{"name": "shell"}); again.Digest != digest {
		t.Errorf("second image_build = %+v", again)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("image_build of an up-to-date image took %s", d)
	}
	sh = findImage(ok[imageListOut](c, "image_list", map[string]any{}), "shell")
	if sh == nil || sh.Digest != digest || sh.UpToDate == nil || !*sh.UpToDate {
		t.Fatalf("after image_build, shell = %+v", sh)
	}

	// In use: refused.
	sb := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"})
	sh = findImage(ok[imageListOut](c, "image_list", map[string]any{}), "shell")
	if sh == nil || sh.InUse != 1 || !slices.Equal(sh.Users, []string{sb.ID}) {
		t.Fatalf("shell with %s live = %+v", sb.ID, sh)
	}
	if b := ok[apitypes.Image](c, "image_build", map[string]any{"name": "shell"}); b.InUse != 1 || !slices.Equal(b.Users, []string{sb.ID}) {
		t.Errorf("image_build with %s live = %+v", sb.ID, b)
	}
	code, msg := errCode(t, c.call("image_delete", map[string]any{"name": "shell"}, nil))
	if code != "conflict" || !strings.Contains(msg, sb.ID) {
		t.Fatalf("image_delete of an image in use: %s %q, want conflict naming %s", code, msg, sb.ID)
	}
	ok[sandboxTerminateOut](c, "sandbox_terminate", map[string]any{"sandbox_id": sb.ID})

	del := ok[apitypes.ImageDeleteResult](c, "image_delete", map[string]any{"name": "shell"})
	if del.Name != "shell" || !del.Deleted {
		t.Fatalf("image_delete = %+v", del)
	}
	l = ok[imageListOut](c, "image_list", map[string]any{})
	if findImage(l, "shell") != nil || !unbuilt(l, "shell", false) {
		t.Errorf("after image_delete: %+v", l)
	}
	if _, err := os.Stat(filepath.Join(store, digest)); !os.IsNotExist(err) {
		t.Errorf("deleted image's tree: %v", err)
	}
	if _, err := os.Stat(filepath.Join(testenv.ImagesDir(), digest, "rootfs", "bin")); err != nil {
		t.Errorf("the shared cache's shell image lost files: %v", err)
	}
	code, msg = errCode(t, c.call("image_delete", map[string]any{"name": "shell"}, nil))
	if code != "not_found" || !strings.HasPrefix(msg, "name:") {
		t.Errorf("image_delete of a deleted image: %s %q, want not_found naming name", code, msg)
	}
}

// TestImageToolsBadInput: every kind of bad input gets its taxonomy code
// and names the field.
func TestImageToolsBadInput(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		code string
	}{
		{"image_build", map[string]any{}, "invalid_argument"},
		{"image_build", map[string]any{"name": nil}, "invalid_argument"},
		{"image_build", map[string]any{"name": 7}, "invalid_argument"},
		{"image_build", map[string]any{"name": ""}, "invalid_argument"},
		{"image_build", map[string]any{"name": "nosuch"}, "invalid_argument"},
		{"image_build", map[string]any{"name": "vm-python"}, "invalid_argument"},
		{"image_build", map[string]any{"name": "../shell"}, "invalid_argument"},
		{"image_build", map[string]any{"name": "she\x00ll"}, "invalid_argument"},
		{"image_build", map[string]any{"name": strings.Repeat("a", 300)}, "invalid_argument"},
		{"image_build", map[string]any{"name": "nosuch", "vm": true}, "invalid_argument"},
		{"image_build", map[string]any{"name": "a/b", "vm": true}, "invalid_argument"},
		{"image_build", map[string]any{"name": "shell", "vm": "yes"}, "invalid_argument"},
		{"image_build", map[string]any{"name": "shell", "force": true}, "invalid_argument"},
		{"image_delete", map[string]any{}, "invalid_argument"},
		{"image_delete", map[string]any{"name": "a/b"}, "invalid_argument"},
		{"image_delete", map[string]any{"name": strings.Repeat("a", 64)}, "invalid_argument"},
		{"image_delete", map[string]any{"name": "nosuch"}, "not_found"},
		{"image_list", map[string]any{"x": 1}, "invalid_argument"},
	} {
		code, msg := errCode(t, c.call(tc.tool, tc.args, nil))
		field := "name"
		switch {
		case tc.tool == "image_list" || tc.args["force"] != nil:
			field = "arguments"
		case tc.args["vm"] == "yes":
			field = "vm"
		}
		if code != tc.code || !strings.HasPrefix(msg, field+":") {
			t.Errorf("%s %.80v: %s %q, want %s naming %s", tc.tool, tc.args, code, msg, tc.code, field)
		}
		if len(msg) > 1000 {
			t.Errorf("%s: message of %d bytes", tc.tool, len(msg))
		}
	}
	// Nothing was built or deleted by the refused calls: the shared cache
	// still has shell (up to date).
	res := c.call("image_list", map[string]any{}, nil)
	var l imageListOut
	decodeStructured(t, res, &l)
	t.Logf("image_list text part:\n%s", text(res))
	sh := findImage(l, "shell")
	if sh == nil || sh.UpToDate == nil || !*sh.UpToDate {
		t.Errorf("shell after bad input: %+v", sh)
	}
}

// TestImageBuildVMGuest: image_build {vm: true} of the Linux guest returns
// its guest image, up to date (the shared cache has it once any VM test
// ran — pkg/engine's run before this package's in make test —, else this
// builds it, as every VM test would on a cold cache).
func TestImageBuildVMGuest(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	start := time.Now()
	img := ok[apitypes.Image](c, "image_build", map[string]any{"name": "linux", "vm": true})
	if img.Name != "vm-linux" || !img.VM || img.Recipe != "linux" || img.UpToDate == nil || !*img.UpToDate {
		t.Errorf("image_build {linux, vm} = %+v", img)
	}
	t.Logf("image_build {linux, vm: true} took %s", time.Since(start))
}
