package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
)

// hostSecret is the content of a file beside the image store, outside
// every build context: no build may put it into an image.
const hostSecret = "HOST-SECRET-7f3a9c"

// FuzzDockerfileBuild runs Dockerfile builds (image_build's request:
// the Dockerfile, an inline context file, dockerfile_path and a build
// arg) through the image service and BuildKit's parser into a real image
// store. RUN steps are not run: the daemon's Run would run them in a
// sandbox; here each makes an empty layer and its RunStep is checked.
// Properties: a build fails with a taxonomy code a client can act on
// (invalid_argument for what the request says, not_found for an unknown
// base), never internal; a file outside the context never reaches the
// image; nothing is written outside the store; a built image's WORKDIR
// and every RUN's directory are clean absolute paths.
func FuzzDockerfileBuild(f *testing.F) {
	for _, c := range []struct{ dockerfile, name, content, dfPath, arg string }{
		{"FROM base\nWORKDIR /app\nCOPY main.py .\nENV A=b\nRUN python3 main.py\nCMD [\"python3\",\"main.py\"]\n", "main.py", "print(1)", "", ""},
		{"ARG V=1\nFROM base\nARG V\nLABEL v=$V\nEXPOSE 8000 53/udp\nUSER user\nENTRYPOINT echo hi\n", "x", "", "", "V"},
		{"", "Dockerfile", "FROM base\nCOPY . /ctx\n", "Dockerfile", ""},
		{"FROM base\nCOPY ../../../secret /s\n", "a", "b", "", ""},
		{"FROM base\nADD ../secret /s\n", "a", "b", "", ""},
		{"FROM base\nCOPY a /x\nWORKDIR /x\n", "a", "b", "", ""},
		{"FROM base\nWORKDIR ../../..\nRUN ls\n", "a", "b", "", ""},
		{"FROM base\nUSER nobody:nogroup\n", "a", "b", "", ""},
		{"FROM base\nCOPY --chown=user:user --chmod=4755 a /a\n", "a", "b", "", ""},
		{"FROM base\nRUN --mount=type=bind,target=/x ls\n", "a", "b", "", ""},
		{"FROM base\nRUN <<EOF\nls\nEOF\n", "a", "b", "", ""},
		{"FROM other\n", "a", "b", "", ""},
		{"FROM base AS one\nFROM base\n", "a", "b", "", ""},
		{"# escape=`\nFROM base\nRUN echo `\n  hi\n", "a", "b", "", ""},
		{"FROM base\nONBUILD RUN ls\n", "a", "b", "", ""},
		{"FROM base\n", "../escape", "x", "", ""},
		{"", "a", "b", "../../../secret", ""},
	} {
		f.Add(c.dockerfile, c.name, c.content, c.dfPath, c.arg)
	}
	outer := f.TempDir()
	if err := os.WriteFile(filepath.Join(outer, "secret"), []byte(hostSecret), 0o644); err != nil {
		f.Fatal(err)
	}
	s := newService(f)
	st := s.images
	// The base: a root with the accounts USER resolves against.
	baseRoot := filepath.Join(outer, "base")
	if err := os.MkdirAll(filepath.Join(baseRoot, "etc"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(baseRoot, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/sh\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(baseRoot, "etc", "group"), []byte("root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	base := &image.Image{Name: "base", Digest: strings.Repeat("ab", 32), Rootfs: baseRoot,
		Env: map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/root"}, User: image.UserSpec{Name: "root", Home: "/root"}}
	var mu sync.Mutex
	var runs []oci.RunStep
	b := oci.Builders{
		Base: func(_ context.Context, name string) (*image.Image, error) {
			if name != "base" {
				return nil, errdefs.NotFoundf("image: no image %q", name)
			}
			return base, nil
		},
		Run: func(_ context.Context, step oci.RunStep, layer io.Writer) error {
			mu.Lock()
			runs = append(runs, step)
			mu.Unlock()
			return tar.NewWriter(layer).Close()
		},
	}
	storeEntries := func() map[string]bool {
		m := map[string]bool{}
		ents, _ := os.ReadDir(outer)
		for _, e := range ents {
			m[e.Name()] = true
		}
		return m
	}
	before := storeEntries()
	f.Fuzz(func(t *testing.T, dockerfile, name, content, dfPath, arg string) {
		req := apitypes.DockerfileBuildRequest{Dockerfile: dockerfile, DockerfilePath: dfPath, Tag: "fuzzed",
			Files: map[string]string{name: content, "main.py": "print(1)"}}
		if arg != "" {
			req.BuildArgs = map[string]string{arg: "v"}
		}
		mu.Lock()
		runs = nil
		mu.Unlock()
		out, err := s.Build(context.Background(), req, nil, b, nil)
		defer func() { _ = st.Remove("fuzzed") }()
		if err != nil {
			switch errdefs.CodeOf(err) {
			case errdefs.InvalidArgument, errdefs.NotFound, errdefs.LimitExceeded:
			default:
				t.Fatalf("build of %q (file %q, dockerfile_path %q, arg %q): %v (code %s)", dockerfile, name, dfPath, arg, err, errdefs.CodeOf(err))
			}
		}
		mu.Lock()
		for _, r := range runs {
			if r.Cwd != "" && (!path.IsAbs(r.Cwd) || path.Clean(r.Cwd) != r.Cwd) {
				t.Fatalf("RUN in directory %q", r.Cwd)
			}
			if len(r.Argv) == 0 {
				t.Fatalf("RUN with no argv")
			}
		}
		mu.Unlock()
		if after := storeEntries(); len(after) != len(before) {
			t.Fatalf("build of %q wrote beside the store: %v", dockerfile, after)
		}
		if err != nil {
			return
		}
		img, err := st.Get(out.Name)
		if err != nil {
			t.Fatalf("built %s is not in the store: %v", out.Name, err)
		}
		if wd := img.OCI.WorkingDir; wd != "" && (!path.IsAbs(wd) || path.Clean(wd) != wd) {
			t.Fatalf("image WORKDIR %q", wd)
		}
		_ = filepath.WalkDir(img.Rootfs, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if data, _ := os.ReadFile(p); bytes.Contains(data, []byte(hostSecret)) {
				t.Fatalf("build of %q put the host's file in the image at %s", dockerfile, p)
			}
			return nil
		})
	})
}
