package e2e

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
)

// TestImagesPullImportCLI drives OCI images the way an administrator
// does: sandboxctl images pull from a real registry (its CA and
// credentials in the daemon's configuration), sandboxctl images import of
// a docker save archive of the same image (the same digest), a sandbox
// from the pulled reference, and a hostile image refused with its entry
// named and nothing left in the store.
func TestImagesPullImportCLI(t *testing.T) {
	reg := testenv.NewRegistry(t, true)
	good := testenv.MakeOCIImage(t, v1.Config{WorkingDir: "/srv", Env: []string{"MARK=e2e"}}, []testenv.OCILayer{
		{Tar: testenv.TreeTar(t, testenv.EnsureImages(t, "shell")["shell"].Rootfs), Comp: "gzip"},
		{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "srv/", Type: tar.TypeDir}, testenv.TarEntry{Name: "srv/hello", Body: "hello from the registry\n"}), Comp: "zstd"},
	}, testenv.OCIImageOpts{})
	ref := reg.Push(t, reg.Ref("e2e/shell:1"), good)
	bad := reg.Push(t, reg.Ref("e2e/evil:1"), testenv.MakeOCIImage(t, v1.Config{}, []testenv.OCILayer{
		{Tar: testenv.TarOf(t, testenv.TarEntry{Name: "bin/", Type: tar.TypeDir}, testenv.TarEntry{Name: "bin/escape", Type: tar.TypeSymlink, Link: "../../../../../root"}), Comp: "gzip"},
	}, testenv.OCIImageOpts{}))

	d := testenv.NewDaemon(t)
	d.Config.Paths.ImagesDir = t.TempDir()
	d.Config.Images.Registries = []config.Registry{{Host: reg.Host, Username: reg.Username, PasswordEnv: "TEST_REGISTRY_PASSWORD", CAFile: reg.CAFile}}
	d.Config.Images.AllowPull = []string{reg.Host}
	d.ExtraEnv = append(d.ExtraEnv, "TEST_REGISTRY_PASSWORD="+reg.Password)
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()

	out, errOut, code := d.Ctl("--json", "images", "pull", ref.String())
	if code != 0 {
		t.Fatalf("images pull: exit %d: %s", code, errOut)
	}
	var pulled apitypes.Image
	if err := json.Unmarshal([]byte(out), &pulled); err != nil {
		t.Fatalf("images pull output %q: %v", out, err)
	}
	want, _ := good.ConfigName()
	if pulled.Digest != want.Hex || pulled.OCI == nil || pulled.OCI.WorkingDir != "/srv" {
		t.Fatalf("pulled %+v, want digest %s", pulled, want.Hex)
	}
	if !strings.Contains(errOut, "layer 2/2") {
		t.Errorf("no layer progress on stderr: %q", errOut)
	}

	// The same image from a docker save archive: the same digest.
	archive := filepath.Join(t.TempDir(), "shell.tar")
	tag, _ := name.NewTag("example.test/shell:saved")
	if err := tarball.WriteToFile(archive, tag, good); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = d.Ctl("--json", "images", "import", archive)
	if code != 0 {
		t.Fatalf("images import: exit %d: %s", code, errOut)
	}
	var imported apitypes.Image
	if err := json.Unmarshal([]byte(out), &imported); err != nil {
		t.Fatal(err)
	}
	if imported.Digest != pulled.Digest || imported.Name != pulled.Name {
		t.Errorf("imported %s %s, pulled %s %s", imported.Name, imported.Digest, pulled.Name, pulled.Digest)
	}
	// The image is stored already: nothing is unpacked again, and the
	// layer store still holds its two layers once.
	if strings.Contains(errOut, "layer ") {
		t.Errorf("the import unpacked layers of a stored image: %q", errOut)
	}
	if layers, err := os.ReadDir(filepath.Join(d.Config.Paths.ImagesDir, "layers")); err != nil || len(layers) != 2 {
		t.Errorf("layer store: %d entries (%v), want 2", len(layers), err)
	}

	// A sandbox from the reference runs in the image's WorkingDir.
	id := strings.TrimSpace(d.MustCtl("create", "--image", ref.String()))
	out = d.MustCtl("exec", id, "--", "sh", "-c", "pwd; cat hello; echo $MARK")
	if out != "/srv\nhello from the registry\ne2e\n" {
		t.Errorf("exec in the pulled image: %q", out)
	}

	// The hostile image: refused, the entry named, nothing stored.
	_, errOut, code = d.Ctl("images", "pull", bad.String())
	if code == 0 || !strings.Contains(errOut, `entry "bin/escape"`) || !strings.Contains(errOut, "leads out") {
		t.Errorf("hostile pull: exit %d: %s", code, errOut)
	}
	out = d.MustCtl("--json", "images", "ls")
	var list []apitypes.Image
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != pulled.Name {
		t.Errorf("images after the hostile pull: %s", out)
	}
}
