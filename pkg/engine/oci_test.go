package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// TestSandboxFromPulledImage is the acceptance test of OCI pulls: a
// private python image pulled from a real registry on first use by
// sandbox_create, then again by digest, runs python3 as the image's user in
// its WorkingDir with its Env.
func TestSandboxFromPulledImage(t *testing.T) {
	if testing.Short() {
		t.Skip("pulls a 250 MiB image")
	}
	reg := testenv.NewRegistry(t, true)
	img := testenv.PythonOCIImage(t)
	ref := reg.Push(t, reg.Ref("team/python:3"), img)
	env := newTestEngine(t, func(c *config.Config) {
		c.Paths.ImagesDir = t.TempDir()
		c.Images.Registries = []config.Registry{{Host: reg.Host, Username: reg.Username, Password: reg.Password, CAFile: reg.CAFile}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Not pulled, and allow_pull is empty: refused, naming the setting.
	_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Image: ref.String()})
	if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "images.allow_pull") {
		t.Fatalf("create from an unpulled reference without allow_pull: %v", err)
	}
	env.cfg.Images.AllowPull = []string{reg.Host}

	var lines []string
	start := time.Now()
	info, err := env.CreateSandboxProgress(ctx, CreateSandboxRequest{Image: ref.String()}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pull on first use and create: %v; progress:\n%s", time.Since(start), strings.Join(lines, "\n"))
	if len(lines) != 5 || !strings.Contains(lines[0], "pulling 3 layers") || !strings.HasSuffix(lines[4], "ready") {
		t.Errorf("progress lines %q", lines)
	}
	configDigest, _ := img.ConfigName()
	if info.Image != "oci-"+configDigest.Hex[:12] {
		t.Errorf("sandbox image %q, want oci-%s", info.Image, configDigest.Hex[:12])
	}
	res, err := env.Exec(ctx, ExecRequest{SandboxID: info.ID, Argv: []string{"python3", "-c",
		"import os, pwd; print(os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name, os.getcwd(), os.environ['GREETING'], os.environ['HOME'], sep='|')"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "1001|1001|app|/app|hello from oci|/home/app\n"; res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("python3 -c: exit %d, stdout %q, want %q; stderr %s", res.ExitCode, res.Stdout, want, res.Stderr)
	}
	// The image's Entrypoint is not what runs as PID 1: the daemon's init is.
	res, err = env.Exec(ctx, ExecRequest{SandboxID: info.ID, Command: "cat /proc/1/cmdline | tr '\\0' ' '"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, "python3") || strings.Contains(res.Stdout, "main.py") {
		t.Errorf("PID 1 is the image's entrypoint: %q", res.Stdout)
	}

	// By digest: pulled again (a new reference), the same image; a create
	// from it needs no pull.
	manifestDigest, _ := img.Digest()
	byDigest := ref.Context().Digest(manifestDigest.String()).String()
	var events []apitypes.ImageProgress
	pulled, err := env.PullImage(ctx, byDigest, func(p apitypes.ImageProgress) { events = append(events, p) })
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Name != info.Image || pulled.OCI == nil || pulled.OCI.UID != 1001 || pulled.OCI.WorkingDir != "/app" {
		t.Errorf("pull by digest: %+v %+v", pulled, pulled.OCI)
	}
	if len(events) == 0 || events[len(events)-1].Phase != "done" {
		t.Errorf("pull events %+v", events)
	}
	env.cfg.Images.AllowPull = nil
	info2, err := env.CreateSandbox(ctx, CreateSandboxRequest{Image: byDigest})
	if err != nil {
		t.Fatal(err)
	}
	if info2.Image != info.Image {
		t.Errorf("create by digest: image %s, want %s", info2.Image, info.Image)
	}

	// Hostile references are refused with the field named.
	for _, bad := range []string{"UPPER/case:tag", reg.Host + "/x:" + strings.Repeat("t", 200), "a/b@sha256:zz"} {
		if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Image: bad}); errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), "image") {
			t.Errorf("create from %q: %v, want invalid_argument naming image", bad, err)
		}
	}
}

// BenchmarkCreatePulledVsLanguage creates, alternately in one run, sandboxes
// from the pulled python OCI image and from the python language image
// (the same Debian tree, recipe-built) and reports both medians and their
// ratio: an OCI image starts as fast as a recipe's.
// Run with: go test -tags seccomp -run '^$' -bench CreatePulled -benchtime 10x ./pkg/engine/
func BenchmarkCreatePulledVsLanguage(b *testing.B) {
	requireRoot(b)
	reg := testenv.NewRegistry(b, false)
	lang := testenv.EnsureImages(b, "python")["python"]
	ref := reg.Push(b, reg.Ref("bench/python:1"), testenv.PythonOCIImage(b))
	// A private store holding the language image (hard links of the
	// shared cache's tree) beside the pulled one, so the pull leaves the
	// shared cache alone.
	dir := b.TempDir()
	if out, err := exec.Command("cp", "-al", filepath.Dir(lang.Rootfs), filepath.Join(dir, lang.Digest)).CombinedOutput(); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "by-name"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink("../"+lang.Digest, filepath.Join(dir, "by-name", "python")); err != nil {
		b.Fatal(err)
	}
	env := newTestEngine(b, func(c *config.Config) {
		c.Paths.ImagesDir = dir
		c.Images.BuildOnDemand = false
		c.Images.Registries = []config.Registry{{Host: reg.Host, CAFile: reg.CAFile}}
	})
	ctx := context.Background()
	pulled, err := env.PullImage(ctx, ref.String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var fromOCI, fromLang []time.Duration
	for i := 0; i < b.N; i++ {
		for _, c := range []struct {
			req CreateSandboxRequest
			d   *[]time.Duration
		}{{CreateSandboxRequest{Image: pulled.Name}, &fromOCI}, {CreateSandboxRequest{Language: "python"}, &fromLang}} {
			t0 := time.Now()
			info, err := env.CreateSandbox(ctx, c.req)
			if err != nil {
				b.Fatal(err)
			}
			*c.d = append(*c.d, time.Since(t0))
			if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(ms(median(fromOCI)), "ms/create-oci")
	b.ReportMetric(ms(median(fromLang)), "ms/create-lang")
	b.ReportMetric(float64(median(fromOCI))/float64(median(fromLang)), "oci/lang")
}

// TestTemplateFromReference: template_create takes a registry reference
// as sandbox_create does, through the same resolution: a tenant's key is
// held to the pull rules (a loopback registry refused, naming image), an
// image pulled already is taken without pulling, an unpulled one is
// pulled when images.allow_pull lets it; a create of the template runs
// the pulled image.
func TestTemplateFromReference(t *testing.T) {
	requireRoot(t)
	reg := testenv.NewRegistry(t, false)
	base := testenv.EnsureImages(t, "shell")["shell"].Rootfs
	img := testenv.MakeOCIImage(t, v1.Config{Env: []string{"FROM_TEMPLATE=yes"}}, []testenv.OCILayer{{Tar: testenv.TreeTar(t, base), Comp: "gzip"}}, testenv.OCIImageOpts{})
	ref := reg.Push(t, reg.Ref("tmpl/shell:1"), img).String()
	other := reg.Push(t, reg.Ref("tmpl/shell:2"), img).String()
	env := newTestEngine(t, func(c *config.Config) {
		c.Paths.ImagesDir = t.TempDir()
		c.Images.AllowPull = []string{reg.Host}
		c.Images.Registries = []config.Registry{{Host: "registry.example", CAFile: reg.CAFile}} // the CA only
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key, err := env.Tenants().Create(ctx, apitypes.KeyCreateRequest{Name: "team"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.Tenants().Authenticate(key.Secret, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	tenant := principal.With(ctx, p)

	// Not pulled: the tenant's template_create would pull from loopback.
	_, err = env.CreateTemplate(tenant, apitypes.TemplateCreateRequest{Name: "pulled", Image: ref})
	if errdefs.CodeOf(err) != errdefs.PermissionDenied || !strings.HasPrefix(errdefs.MessageOf(err), "image: registry "+reg.Host) || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("tenant's template_create of an unpulled loopback reference: %v, want permission_denied naming image and the address", err)
	}
	// So would its sandbox_create: the same rule, the same words.
	_, cerr := env.CreateSandbox(tenant, CreateSandboxRequest{Image: ref})
	if errdefs.CodeOf(cerr) != errdefs.PermissionDenied || errdefs.MessageOf(cerr) != errdefs.MessageOf(err) {
		t.Fatalf("tenant's sandbox_create: %v; template_create said %v", cerr, err)
	}

	// Pulled by the administrator: the tenant's template takes it.
	pulled, err := env.PullImage(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := env.CreateTemplate(tenant, apitypes.TemplateCreateRequest{Name: "pulled", Image: ref})
	if err != nil {
		t.Fatalf("template_create of a pulled reference: %v", err)
	}
	if tmpl.Image != ref {
		t.Errorf("template image %q, want the reference %q as given", tmpl.Image, ref)
	}
	info, err := env.CreateSandbox(tenant, CreateSandboxRequest{Template: "pulled"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Image != pulled.Name {
		t.Errorf("sandbox of the template runs %q, want the pulled %s", info.Image, pulled.Name)
	}
	res, err := env.Exec(tenant, ExecRequest{SandboxID: info.ID, Command: "echo $FROM_TEMPLATE"}, nil)
	if err != nil || strings.TrimSpace(res.Stdout) != "yes" {
		t.Errorf("exec in the template's sandbox: %+v, %v", res, err)
	}

	// Unpulled, by an admin: pulled by template_create (allow_pull lists
	// the registry), as a create would.
	if _, err := env.CreateTemplate(ctx, apitypes.TemplateCreateRequest{Name: "pulled-now", Image: other}); err != nil {
		t.Fatalf("admin's template_create of an unpulled reference: %v", err)
	}
	if name, err := env.imgs.Pulled("image", other); err != nil || name != pulled.Name {
		t.Errorf("after template_create, %s is pulled as %q (%v), want %s", other, name, err, pulled.Name)
	}
}
