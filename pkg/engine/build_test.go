package engine

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// buildSteps summarises a build's step events: instruction → cached.
func buildSteps(events []apitypes.BuildProgress) (ran, cached []string) {
	for _, e := range events {
		if e.Phase != "step" || e.Instruction == "" {
			continue
		}
		if e.Layer == "" {
			continue // a step without a layer (ENV, USER, ...) or its start
		}
		if e.Cached {
			cached = append(cached, e.Instruction)
		} else {
			ran = append(ran, e.Instruction)
		}
	}
	return ran, cached
}

// TestDockerfileBuild is the acceptance test of Dockerfile builds: FROM a
// language image, RUN apt-get install from the topology's signed mirror
// (network allowlist), COPY with --chown, ENV, WORKDIR, USER; a sandbox
// from the result runs as the USER in the WORKDIR with the ENV and the
// package; the rebuild is a cache hit on every step; a change of the last
// COPY's file reruns only that step.
func TestDockerfileBuild(t *testing.T) {
	requireRoot(t)
	testenv.EnsureImages(t, "shell")
	tp := newNetTopology(t)
	images := testenv.SeedImages(t, "shell")
	env := newEngineIn(t, tp.HostNS, upstreamNetwork("sbxd"+randHex(2)), func(c *config.Config) { c.Paths.ImagesDir = images })
	base, err := env.imgs.Image("shell")
	if err != nil {
		t.Fatal(err)
	}
	osRelease, err := os.ReadFile(filepath.Join(base.Rootfs, "etc/os-release"))
	if err != nil {
		t.Fatal(err)
	}
	suite := ""
	for _, l := range strings.Split(string(osRelease), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok {
			suite = v
		}
	}
	repo := testenv.NewAptRepository(t, suite, "amd64", testenv.DebianPackage(t, "hello"))
	debs := 0
	tp.mux.Handle("/debian/", http.StripPrefix("/debian/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".deb") {
			debs++
		}
		http.FileServer(http.Dir(repo.Root)).ServeHTTP(w, r)
	})))

	files := map[string]string{
		"sandboxd-test.gpg": string(repo.Keyring),
		"app/main.sh":       "#!/bin/sh\necho app says $GREETING\n",
		"settings.conf":     "level=1\n",
	}
	dockerfile := `# A build of every kind of step.
FROM shell
# A language image's user is its sandbox user, as a base image's USER is.
USER root
ARG MIRROR=pkg.example.test
ENV GREETING="hello from the build" APP_HOME=/srv/app
COPY sandboxd-test.gpg /etc/apt/keyrings/
RUN rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && \
    echo "deb [signed-by=/etc/apt/keyrings/sandboxd-test.gpg] http://${MIRROR}/debian ` + suite + ` main" > /etc/apt/sources.list.d/local.list && \
    apt-get update -q && apt-get install -y -q --no-install-recommends hello && \
    rm -rf /var/lib/apt/lists/* && useradd -m -u 1234 builder
WORKDIR $APP_HOME
COPY --chown=builder:builder --chmod=755 app/ ./
USER builder
LABEL org.example.purpose=test
CMD ["/srv/app/main.sh"]
COPY settings.conf conf/
`
	req := apitypes.DockerfileBuildRequest{Dockerfile: dockerfile, Tag: "dfapp", Files: files, Network: NetworkAllowlist, Allow: []string{"pkg.example.test"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := func(req apitypes.DockerfileBuildRequest) (*apitypes.Image, []apitypes.BuildProgress, time.Duration) {
		t.Helper()
		var events []apitypes.BuildProgress
		start := time.Now()
		img, err := env.BuildDockerfile(ctx, req, nil, func(p apitypes.BuildProgress) { events = append(events, p) })
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		return img, events, time.Since(start)
	}
	img, events, first := build(req)
	ran, cached := buildSteps(events)
	if len(ran) != 4 || len(cached) != 0 || debs != 1 {
		t.Errorf("first build: ran %q, cached %q, want the 4 layer steps run; the mirror served %d .debs, want 1", ran, cached, debs)
	}
	if img.Name != "dfapp" || img.OCI == nil || img.OCI.User != "builder" || img.OCI.UID != 1234 || img.OCI.Labels["org.example.purpose"] != "test" || img.OCI.WorkingDir != "/srv/app" || len(img.OCI.Cmd) != 1 {
		t.Errorf("built image: %+v %+v", img, img.OCI)
	}

	info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Image: "dfapp"})
	if err != nil {
		t.Fatal(err)
	}
	res := env.sh(t, info.ID, `id -un; id -u; pwd; echo "$GREETING"; echo "$HOME"; hello; ./main.sh; cat conf/settings.conf; stat -c '%U %a' main.sh /etc/apt/keyrings/sandboxd-test.gpg`)
	want := "builder\n1234\n/srv/app\nhello from the build\n/home/builder\nHello, world!\napp says hello from the build\nlevel=1\nbuilder 755\nroot 644\n"
	if res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("sandbox from the built image: exit %d\n%s\nwant\n%s\nstderr %s", res.ExitCode, res.Stdout, want, res.Stderr)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}

	// The same Dockerfile and context: no step runs.
	img2, events, again := build(req)
	ran, cached = buildSteps(events)
	if len(ran) != 0 || len(cached) != 4 || img2.Digest != img.Digest || debs != 1 {
		t.Errorf("rebuild: ran %q, cached %q, digest %s want %s; .debs served %d", ran, cached, img2.Digest, img.Digest, debs)
	}
	t.Logf("first build %v, rebuild (all %d layer steps cached) %v", first.Round(time.Millisecond), len(cached), again.Round(time.Millisecond))

	// A change to the last COPY's file reruns that step only.
	files["settings.conf"] = "level=2\n"
	img3, events, changed := build(req)
	ran, cached = buildSteps(events)
	if len(ran) != 1 || !strings.HasPrefix(ran[0], "COPY settings.conf") || len(cached) != 3 || img3.Digest == img.Digest {
		t.Errorf("after changing settings.conf: ran %q, cached %q", ran, cached)
	}
	t.Logf("rebuild with the last COPY changed: %v", changed.Round(time.Millisecond))
	info, err = env.CreateSandbox(ctx, CreateSandboxRequest{Image: "dfapp"})
	if err != nil {
		t.Fatal(err)
	}
	if res := env.sh(t, info.ID, "cat conf/settings.conf"); res.Stdout != "level=2\n" {
		t.Errorf("settings after the rebuild: %q", res.Stdout)
	}
	if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	// images prune removes the first build's image (stale: "dfapp" is the
	// third's now) and the layer only it used, the first settings.conf's;
	// no build context or spool file is left beside the layers.
	settingsV1 := img.OCI.Layers[len(img.OCI.Layers)-1]
	if _, err := env.PruneImages(ctx); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(images, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	for _, e := range entries {
		stored = append(stored, "sha256:"+e.Name())
	}
	for _, l := range img3.OCI.Layers {
		if !slices.Contains(stored, l) {
			t.Errorf("layer %s of the current image removed by prune", l)
		}
	}
	if slices.Contains(stored, settingsV1) || len(stored) != len(img3.OCI.Layers) {
		t.Errorf("layers after prune: %v; want those of the current image %v (the first settings.conf's %s removed), nothing else", stored, img3.OCI.Layers, settingsV1)
	}
	// No intermediate image is left.
	for _, n := range env.knownImages() {
		if strings.HasPrefix(n, "build-") {
			t.Errorf("intermediate image %s left", n)
		}
	}

	// Bad Dockerfiles are refused naming the line; hostile contexts naming
	// the entry.
	for _, c := range []struct{ dockerfile, want string }{
		{"FROM shell\nVOLUME /data\n", "line 2: VOLUME is refused"},
		{"FROM shell\nRUN\n", "line 2"},
		{"FROM shell\nFROBNICATE x\n", "line 2"},
		{"FROM shell\n\nADD http://pkg.example.test/x /x\n", "line 3: ADD http://pkg.example.test/x: URLs are refused"},
		{"FROM shell\nRUN --mount=type=cache,target=/x true\n", "line 2: RUN --mount is refused"},
		{"FROM shell AS a\nFROM a\n", "line 2: multi-stage"},
		{"FROM nosuchimage\n", "line 1: FROM nosuchimage"},
		{"FROM shell\nCOPY missing.txt /\n", "line 2: COPY missing.txt: no such file"},
		{"FROM shell\nCOPY ../secret /\n", `line 2: COPY ../secret: ".." leads out of the context`},
		{"FROM shell\nRUN exit 3\n", "line 2: RUN: "},
	} {
		_, err := env.BuildDockerfile(ctx, apitypes.DockerfileBuildRequest{Dockerfile: c.dockerfile, Files: map[string]string{"a": "b"}}, nil, nil)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dockerfile %q: %v, want invalid_argument with %q", c.dockerfile, err, c.want)
		}
	}
	for _, c := range []struct {
		files map[string]string
		want  string
	}{
		{map[string]string{"../evil": "x"}, `files: "../evil"`},
		{map[string]string{"/etc/passwd": "x"}, `files: "/etc/passwd"`},
		{map[string]string{"a/../../b": "x"}, `files: "a/../../b"`},
	} {
		_, err := env.BuildDockerfile(ctx, apitypes.DockerfileBuildRequest{Dockerfile: "FROM shell\nCOPY . /\n", Files: c.files}, nil, nil)
		if errdefs.CodeOf(err) != errdefs.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("context %v: %v, want invalid_argument with %q", c.files, err, c.want)
		}
	}
	for _, bad := range []apitypes.DockerfileBuildRequest{
		{Dockerfile: "FROM shell\n", Tag: "python"},
		{Dockerfile: "FROM shell\n", Tag: "Bad Name"},
		{Dockerfile: "FROM shell\n", Network: "open"},
		{Dockerfile: "FROM shell\n", BuildArgs: map[string]string{"UNDECLARED": "x"}},
		{Dockerfile: ""},
	} {
		if _, err := env.BuildDockerfile(ctx, bad, nil, nil); errdefs.CodeOf(err) != errdefs.InvalidArgument {
			t.Errorf("build %+v: %v, want invalid_argument", bad, err)
		}
	}
}
