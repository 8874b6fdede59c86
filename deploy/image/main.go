// Command image builds the OCI image of mcp-sandboxd (`make image`) without
// Docker: a Debian base made by mmdebstrap from the host's own suite and
// apt mirror, and a layer of the project's binaries and data from bin/ and
// the tree, assembled with go-containerregistry into an OCI image layout
// archive that `ctr import` (containerd) loads under its name.
//
// What the image carries, and why (docs/kubernetes.md):
//   - mcp-sandboxd, sandboxctl, sandbox-agent, sandbox-init from bin/ (the
//     daemon and sandbox-init are built with cgo against the host's glibc
//     and libseccomp: the base is the host's Debian suite, so both match);
//   - the tools the daemon runs itself: mmdebstrap (language images),
//     e2fsprogs (mkfs.ext4 for disk-backed sandboxes), ca-certificates;
//     with -vm also qemu-system-x86 and swtpm (the vm backend). No runc:
//     the daemon runs containers through libcontainer in-process;
//   - the language recipes, seccomp profiles and the default configuration.
//
// The node daemon runs privileged on the host's kernel, cgroups, /dev and
// network (deploy/helm), but with the image's userland: nothing of the
// host's is executed.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/image"
)

// basePackages are installed on top of Debian's minbase variant.
var basePackages = []string{"ca-certificates", "e2fsprogs", "libseccomp2", "mmdebstrap"}

// vmPackages are added with -vm.
var vmPackages = []string{"qemu-system-x86", "qemu-utils", "swtpm"}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of mcp-sandboxd, sandboxctl, sandbox-agent and sandbox-init")
	flag.StringVar(&o.tree, "tree", ".", "the source tree (rootfs/, seccomp-profiles/, config/)")
	flag.StringVar(&o.out, "out", "bin/mcp-sandboxd-image.tar", "the OCI archive to write")
	flag.StringVar(&o.name, "name", "mcp-sandboxd:dev", "image name and tag (what the chart's image.repository:tag names)")
	flag.StringVar(&o.base, "base", "", "a root file system tar to use as the base instead of running mmdebstrap")
	flag.StringVar(&o.cache, "cache", "bin/.image-cache", "where mmdebstrap's base tar is kept between builds")
	flag.StringVar(&o.version, "version", "dev", "version label")
	flag.BoolVar(&o.vm, "vm", false, "add QEMU and swtpm for the vm backend (much larger)")
	flag.StringVar(&o.pause, "pause", "", "instead: an image of this one static binary as /pause (the test cluster's pod sandbox image)")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, tree, out, name, base, cache, version, pause string
	vm                                                bool
}

// nameRE is what containerd accepts as a reference after normalisation,
// kept simple: [registry/]path:tag, lower case.
var nameRE = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

func (o *options) validate() error {
	if !nameRE.MatchString(o.name) {
		return errdefs.Invalidf("name %q: want [registry/]path:tag in lower case", o.name)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$`).MatchString(o.version) {
		return errdefs.Invalidf("version %q: letters, digits and ._+- only", o.version)
	}
	return nil
}

func run(ctx context.Context, o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	start := time.Now()
	if o.pause != "" {
		img, err := pauseImage(o.pause)
		if err != nil {
			return err
		}
		return writeArchive(img, o.name, o.out)
	}
	base := o.base
	if base == "" {
		var err error
		if base, err = debianBase(ctx, o); err != nil {
			return err
		}
	}
	img, err := build(base, o)
	if err != nil {
		return err
	}
	if err := writeArchive(img, o.name, o.out); err != nil {
		return err
	}
	st, err := os.Stat(o.out)
	if err != nil {
		return err
	}
	fmt.Printf("image: %s → %s (%d MiB, %s)\n", o.name, o.out, st.Size()>>20, time.Since(start).Round(time.Second))
	return nil
}

// debianBase returns a tar of a minbase root file system of the host's suite
// with basePackages (and vmPackages), made by mmdebstrap once per package
// list and suite and kept in o.cache.
func debianBase(ctx context.Context, o options) (string, error) {
	suite, err := hostSuite("/etc/os-release")
	if err != nil {
		return "", err
	}
	mirror, err := image.HostMirror()
	if err != nil {
		return "", fmt.Errorf("the host's apt mirror: %w", err)
	}
	pkgs := append([]string(nil), basePackages...)
	if o.vm {
		pkgs = append(pkgs, vmPackages...)
	}
	sort.Strings(pkgs)
	key := sha256.Sum256([]byte(suite + "\n" + mirror + "\n" + strings.Join(pkgs, ",")))
	out := filepath.Join(o.cache, "base-"+suite+"-"+hex.EncodeToString(key[:8])+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(o.cache, 0o755); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant=minbase", "--format=tar",
		"--include="+strings.Join(pkgs, ","),
		// No apt lists or caches in the image: the daemon's image builds
		// run their own mmdebstrap.
		"--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*",
		suite, tmp, mirror)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("mmdebstrap: %w", err)
	}
	return out, os.Rename(tmp, out)
}

// hostSuite reads VERSION_CODENAME: the daemon's glibc and libseccomp come
// from the host's suite, so the image's must be the same.
func hostSuite(osRelease string) (string, error) {
	b, err := os.ReadFile(osRelease)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok {
			v = strings.Trim(v, `"`)
			if regexp.MustCompile(`^[a-z]+$`).MatchString(v) {
				return v, nil
			}
		}
	}
	return "", errdefs.FailedPreconditionf("%s names no Debian suite (VERSION_CODENAME)", osRelease)
}

// appFile is one file of the application layer.
type appFile struct {
	src  string // on disk
	dst  string // absolute path in the image
	mode int64
}

// appFiles lists the application layer: binaries, recipes, profiles, config.
func appFiles(o options) ([]appFile, error) {
	files := []appFile{
		{filepath.Join(o.bin, "mcp-sandboxd"), "/usr/bin/mcp-sandboxd", 0o755},
		{filepath.Join(o.bin, "sandboxctl"), "/usr/bin/sandboxctl", 0o755},
		{filepath.Join(o.bin, "sandbox-agent"), "/usr/libexec/mcp-sandboxd/sandbox-agent", 0o755},
		// Every container's `runc init`, found beside the agent.
		{filepath.Join(o.bin, "sandbox-init"), "/usr/libexec/mcp-sandboxd/sandbox-init", 0o755},
		{filepath.Join(o.tree, "config", "mcp-sandboxd.yaml"), "/etc/mcp-sandboxd/mcp-sandboxd.yaml", 0o644},
	}
	for _, tree := range []struct{ src, dst string }{
		{"rootfs", "/usr/share/mcp-sandboxd/rootfs"},
		{"seccomp-profiles", "/usr/share/mcp-sandboxd/seccomp-profiles"},
	} {
		root := filepath.Join(o.tree, tree.src)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if !d.Type().IsRegular() {
				return errdefs.Invalidf("%s: not a regular file", p)
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			files = append(files, appFile{p, filepath.ToSlash(filepath.Join(tree.dst, rel)), int64(info.Mode().Perm() | 0o444)})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f.src); err != nil {
			return nil, fmt.Errorf("%s (run make build first): %w", f.src, err)
		}
	}
	return files, nil
}

// appLayer writes files as one uncompressed layer tar: directories first,
// fixed times and owners, so that the same inputs give the same digest.
func appLayer(files []appFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	var addDir func(string) error
	addDir = func(d string) error {
		if d == "/" || dirs[d] {
			return nil
		}
		if err := addDir(filepath.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].dst < files[j].dst })
	for _, f := range files {
		if err := addDir(filepath.Dir(f.dst)); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dst, "/"), Mode: f.mode, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// build assembles the image: the base tar, the application layer, and a
// configuration whose default command is the node daemon.
func build(baseTar string, o options) (v1.Image, error) {
	files, err := appFiles(o)
	if err != nil {
		return nil, err
	}
	app, err := appLayer(files)
	if err != nil {
		return nil, err
	}
	baseLayer, err := tarball.LayerFromFile(baseTar, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("base layer %s: %w", baseTar, err)
	}
	appLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(app)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: baseLayer, History: v1.History{CreatedBy: "mmdebstrap --variant=minbase (deploy/image)", Created: v1.Time{Time: time.Unix(0, 0)}}},
		mutate.Addendum{Layer: appLayer, History: v1.History{CreatedBy: "mcp-sandboxd binaries and data (deploy/image)", Created: v1.Time{Time: time.Unix(0, 0)}}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"mcp-sandboxd", "serve"}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "mcp-sandboxd",
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.source":  "https://github.com/sandboxrunner/mcp-sandboxd",
	}
	return mutate.ConfigFile(img, cf)
}

// pauseImage is an image of one static binary, /pause, its entrypoint.
func pauseImage(bin string) (v1.Image, error) {
	layer, err := appLayer([]appFile{{src: bin, dst: "/pause", mode: 0o755}})
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, l); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/pause"}
	return mutate.ConfigFile(img, cf)
}

// writeArchive writes img as an OCI image layout in a tar, its index entry
// annotated with the name containerd's `ctr import` gives it
// (io.containerd.image.name, normalised as containerd does:
// mcp-sandboxd:dev is docker.io/library/mcp-sandboxd:dev, which is what the
// kubelet looks up for image "mcp-sandboxd:dev").
func writeArchive(img v1.Image, name, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	full := normalise(name)
	_, tag, _ := strings.Cut(full[strings.LastIndex(full, "/")+1:], ":")
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          full,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

// normalise turns a short name into containerd's full reference.
func normalise(name string) string {
	first, _, hasSlash := strings.Cut(name, "/")
	switch {
	case !hasSlash:
		return "docker.io/library/" + name
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		return "docker.io/" + name
	}
	return name
}

// tarDir writes the files under dir into a tar at out (paths relative).
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
