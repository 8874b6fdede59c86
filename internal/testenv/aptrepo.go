package testenv

import (
	"bytes"
	"compress/gzip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DebianPackage downloads the .deb of a Debian package with the host's own
// apt (its configured mirror and package lists, as the image builder uses
// the host's mirror) into a temporary directory and returns its path.
func DebianPackage(t testing.TB, name string) string {
	t.Helper()
	dir := t.TempDir()
	// The download runs as root: the temporary directory is not _apt's.
	cmd := exec.Command("apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", name)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s (with the host's apt sources): %v\n%s", name, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, name+"_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download %s left %v", name, debs)
	}
	return debs[0]
}

// BuildDebianPackage makes a binary package with dpkg-deb: control is its
// DEBIAN/control (Package, Version, Architecture, Depends, ...), files maps
// paths in it to their contents; files under usr/bin/ are executable.
func BuildDebianPackage(t testing.TB, control string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	all := map[string]string{"DEBIAN/control": control}
	for p, c := range files {
		all[p] = c
	}
	for p, c := range all {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "usr/bin/") {
			mode = 0o755
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tree, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tree, p), []byte(c), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, "package.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", tree, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	// The pool keeps Debian's file names: name_version_arch.deb.
	var name, version, arch string
	for _, line := range strings.Split(control, "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Package":
			name = strings.TrimSpace(v)
		case "Version":
			version = strings.TrimSpace(v)
		case "Architecture":
			arch = strings.TrimSpace(v)
		}
	}
	named := filepath.Join(dir, name+"_"+version+"_"+arch+".deb")
	if err := os.Rename(deb, named); err != nil {
		t.Fatal(err)
	}
	return named
}

// AptRepository is a Debian repository in a directory, laid out as a
// mirror is (dists/<suite>/InRelease, Release, Release.gpg,
// main/binary-<arch>/Packages(.gz); pool/main/), with its indexes made by
// apt-ftparchive and its Release signed by an OpenPGP key made for it by
// gpg; serve Root over HTTP and point apt at it with
// `deb [signed-by=<Keyring>] URL <Suite> main`.
type AptRepository struct {
	Root    string // the directory to serve
	Suite   string
	Keyring []byte // the signing key's public half, a binary keyring for signed-by
}

// NewAptRepository builds a signed repository of suite for arch holding the
// .deb files debs.
func NewAptRepository(t testing.TB, suite, arch string, debs ...string) *AptRepository {
	t.Helper()
	r := &AptRepository{Root: t.TempDir(), Suite: suite}
	for _, deb := range debs {
		data, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		r.write(t, filepath.Join("pool", "main", filepath.Base(deb)), data)
	}
	dist := filepath.Join("dists", suite)
	r.writeIndexes(t, dist, arch)
	r.sign(t, dist)
	return r
}

// run runs a command in the repository's root (env added to the
// test's), its output into stdout when not nil.
func (r *AptRepository) run(t testing.TB, stdout *bytes.Buffer, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = r.Root, append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
}

// write writes file rel of the repository.
func (r *AptRepository) write(t testing.TB, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(r.Root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeIndexes writes Packages (and its gzip) for the one component and
// architecture, and the Release file with the indexes' sizes and hashes.
func (r *AptRepository) writeIndexes(t testing.TB, dist, arch string) {
	t.Helper()
	var packages bytes.Buffer
	r.run(t, &packages, nil, "apt-ftparchive", "packages", "pool")
	if !bytes.Contains(packages.Bytes(), []byte("Filename: pool/main/")) {
		t.Fatalf("apt-ftparchive packages indexed nothing:\n%s", packages.Bytes())
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(packages.Bytes())
	zw.Close()
	bin := filepath.Join(dist, "main", "binary-"+arch)
	r.write(t, filepath.Join(bin, "Packages"), packages.Bytes())
	r.write(t, filepath.Join(bin, "Packages.gz"), gz.Bytes())

	var release bytes.Buffer
	r.run(t, &release, nil, "apt-ftparchive",
		"-o", "APT::FTPArchive::Release::Origin=sandboxd-test",
		"-o", "APT::FTPArchive::Release::Suite="+r.Suite,
		"-o", "APT::FTPArchive::Release::Codename="+r.Suite,
		"-o", "APT::FTPArchive::Release::Architectures="+arch,
		"-o", "APT::FTPArchive::Release::Components=main",
		"release", dist)
	r.write(t, filepath.Join(dist, "Release"), release.Bytes())
}

// sign signs dist's Release (InRelease and Release.gpg) with a key of the
// test's own, made in a GNUPGHOME of its own (short: gpg-agent's socket
// lives there); the agent gpg starts is stopped at the end. Keyring gets
// the key's public half.
func (r *AptRepository) sign(t testing.TB, dist string) {
	t.Helper()
	home, err := os.MkdirTemp("", "sbxgpg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("gpgconf", "--homedir", home, "--kill", "gpg-agent").Run()
		_ = os.RemoveAll(home)
	})
	gpgEnv := []string{"GNUPGHOME=" + home}
	gpg := func(stdout *bytes.Buffer, args ...string) {
		t.Helper()
		r.run(t, stdout, gpgEnv, "gpg", append([]string{"--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""}, args...)...)
	}
	gpg(nil, "--quick-gen-key", "sandboxd test repository <repo@example.test>", "ed25519", "sign", "never")
	var key bytes.Buffer
	gpg(&key, "--export")
	r.Keyring = key.Bytes()
	releasePath := filepath.Join(dist, "Release")
	gpg(nil, "--clearsign", "-o", filepath.Join(dist, "InRelease"), releasePath)
	gpg(nil, "--armor", "--detach-sign", "-o", filepath.Join(dist, "Release.gpg"), releasePath)
}
