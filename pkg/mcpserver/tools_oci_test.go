package mcpserver

import (
	"archive/tar"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestImagePull: image_pull from a real registry reports each layer as a
// progress notification and returns the image with its OCI defaults;
// sandbox_create takes the reference; a hostile image is a tool error
// naming the entry.
func TestImagePull(t *testing.T) {
	testenv.RequireRoot(t)
	reg := testenv.NewRegistry(t, false)
	base := testenv.EnsureImages(t, "shell")["shell"].Rootfs
	img := testenv.MakeOCIImage(t, v1.Config{WorkingDir: "/opt/app", Env: []string{"MODE=mcp"}}, []testenv.OCILayer{
		{Tar: testenv.TreeTar(t, base), Comp: "gzip"},
		{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "opt/app/", Type: tar.TypeDir}, testenv.TarEntry{Name: "opt/app/data", Body: "42\n"}), Comp: "zstd"},
	}, testenv.OCIImageOpts{})
	ref := reg.Push(t, reg.Ref("mcp/shell:1"), img)
	evil := reg.Push(t, reg.Ref("mcp/evil:1"), testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{
		{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "dev/sda9", Type: tar.TypeChar}), Comp: "none"},
	}, testenv.OCIImageOpts{}))
	e := newEngine(t, func(c *config.Config) {
		c.Paths.ImagesDir = t.TempDir()
		c.Images.Registries = []config.Registry{{Host: reg.Host, CAFile: reg.CAFile}}
	})
	c := newClient(t, e, Options{})

	res := c.call("image_pull", map[string]any{"reference": ref.String()}, &mcp.Meta{ProgressToken: "p1"})
	if res.IsError {
		t.Fatal(text(res))
	}
	var got apitypes.Image
	decodeStructured(t, res, &got)
	want, _ := img.ConfigName()
	if got.Digest != want.Hex || got.OCI == nil || got.OCI.WorkingDir != "/opt/app" || len(got.OCI.Layers) != 2 {
		t.Fatalf("image_pull = %+v", got)
	}
	var log strings.Builder
	for _, n := range c.notifications() {
		if n.Method == "notifications/progress" && n.Params.AdditionalFields["progressToken"] == "p1" {
			m, _ := n.Params.AdditionalFields["message"].(string)
			log.WriteString(m)
		}
	}
	if !strings.Contains(log.String(), "layer 1/2") || !strings.Contains(log.String(), "layer 2/2") {
		t.Errorf("image_pull progress = %q, want both layers", log.String())
	}

	sb := ok[sandboxOut](c, "sandbox_create", map[string]any{"image": ref.String()})
	out := ok[apitypes.ExecResult](c, "exec_command", map[string]any{"sandbox_id": sb.ID, "command": "pwd; cat data; echo $MODE"})
	if out.Stdout != "/opt/app\n42\nmcp\n" {
		t.Errorf("exec in the pulled image: %+v", out)
	}

	res = c.call("image_pull", map[string]any{"reference": evil.String()}, nil)
	if !res.IsError || !strings.Contains(text(res), `entry "dev/sda9"`) || !strings.Contains(text(res), "device") {
		t.Errorf("hostile image_pull: error %v %q", res.IsError, text(res))
	}
	res = c.call("image_pull", map[string]any{"reference": "Not A Reference"}, nil)
	if !res.IsError || !strings.Contains(text(res), "reference") {
		t.Errorf("malformed reference: error %v %q", res.IsError, text(res))
	}
}
