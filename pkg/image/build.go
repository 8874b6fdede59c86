package image

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/lifetime"
)

// Builder builds recipes into a Store with mmdebstrap. It needs root: the
// tree is created with real ownership and chroot.
type Builder struct {
	Store *Store
	// Mirror is the Debian mirror URI; empty means HostMirror().
	Mirror string
	// Suite is the Debian suite for recipes that name none.
	Suite string
	// Log receives progress lines (they also go to the build's build.log).
	// It may be nil.
	Log io.Writer
}

// chrootPath is the PATH for mmdebstrap, its hooks and the setup script:
// Debian's default root PATH, independent of the daemon's own environment.
const chrootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// mergedUsrHooks is mmdebstrap's hook directory for merged /usr.
const mergedUsrHooks = "/usr/share/mmdebstrap/hooks/maybe-merged-usr"

// killGrace is how long a cancelled mmdebstrap gets to unmount what it
// mounted in the chroot before its process group is killed.
const killGrace = 15 * time.Second

// dpkgExcludes keep documentation, manual pages and translations out of
// images (about a quarter of a minbase tree). They stay in the image's dpkg
// configuration, so packages installed later inside a sandbox are slim too.
// Copyright files are kept: they are the licence notices.
var dpkgExcludes = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-include=/usr/share/locale/locale.alias",
	"path-exclude=/usr/share/lintian/*",
}

// Digest returns the digest the image built from r would have: a SHA-256
// over the parsed recipe, the content of the files it copies, the suite, the
// mirror and the builder version. Comparing it with the stored image's
// Digest tells whether that image is up to date.
func (b *Builder) Digest(r *Recipe) (string, error) {
	_, _, digest, err := b.resolve(r)
	return digest, err
}

// Ensure returns the image for r, building it only if no image with r's
// digest is stored yet, and makes it the current image for r's name.
func (b *Builder) Ensure(ctx context.Context, r *Recipe) (*Image, error) {
	suite, mirror, digest, err := b.resolve(r)
	if err != nil {
		return nil, err
	}
	if img, err := b.Store.Get(r.Name); err == nil && img.Digest == digest {
		return img, nil
	}
	unlock, err := b.Store.lock(ctx, r.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	img, err := b.Store.lookup(digest)
	if err == nil {
		b.progress(b.Log, r.Name, "image %s is up to date", digest[:12])
		return img, b.Store.setCurrent(r.Name, digest)
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	return b.build(ctx, r, suite, mirror, digest)
}

// Build builds r unconditionally and makes the result the current image for
// its name. If an image with the same digest exists it is replaced, so the
// caller must make sure no sandbox uses it.
func (b *Builder) Build(ctx context.Context, r *Recipe) (*Image, error) {
	suite, mirror, digest, err := b.resolve(r)
	if err != nil {
		return nil, err
	}
	unlock, err := b.Store.lock(ctx, r.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return b.build(ctx, r, suite, mirror, digest)
}

func (b *Builder) resolve(r *Recipe) (suite, mirror, digest string, err error) {
	if err := r.Validate(); err != nil {
		return "", "", "", err
	}
	suite = r.Suite
	if suite == "" {
		suite = b.Suite
	}
	if suite == "" {
		return "", "", "", errdefs.Invalidf("recipe %s: suite: not set in the recipe nor in the builder", r.Name)
	}
	mirror = b.Mirror
	if mirror == "" {
		if mirror, err = HostMirror(); err != nil {
			return "", "", "", err
		}
	}
	digest, err = recipeDigest(r, suite, mirror)
	return suite, mirror, digest, err
}

// build runs one build while holding r.Name's lock. It builds into a
// temporary directory of the store and renames it into place only once the
// tree is complete and verified, so a store never holds a partial image; on
// failure only the log remains, under failed/.
func (b *Builder) build(ctx context.Context, r *Recipe, suite, mirror, digest string) (_ *Image, err error) {
	start := time.Now()
	s := b.Store
	if err := s.removeStale(r.Name); err != nil {
		return nil, fmt.Errorf("build image %q: remove leftovers of earlier builds: %w", r.Name, err)
	}
	tmp, logFile, err := s.newBuildDir(r.Name)
	if err != nil {
		return nil, fmt.Errorf("build image %q: %w", r.Name, err)
	}
	log := io.Writer(logFile)
	if b.Log != nil {
		log = io.MultiWriter(logFile, b.Log)
	}
	defer func() {
		if err == nil {
			return
		}
		b.progress(log, r.Name, "build failed: %v", err)
		logFile.Close()
		failed := filepath.Join(s.dir, failedDir, fmt.Sprintf("%s-%s.log", r.Name, start.UTC().Format("20060102T150405.000Z")))
		if rerr := os.Rename(filepath.Join(tmp, buildLog), failed); rerr != nil {
			failed = filepath.Join(tmp, buildLog)
		}
		if derr := s.discard(r.Name, tmp); derr != nil {
			err = errors.Join(err, fmt.Errorf("remove failed build: %w", derr))
		}
		err = fmt.Errorf("build image %q (log: %s): %w", r.Name, failed, err)
	}()

	b.progress(log, r.Name, "building digest %s from %s %s", digest[:12], mirror, suite)
	packages, size, err := b.buildTree(ctx, r, suite, mirror, filepath.Join(tmp, rootfsDir), log)
	if err != nil {
		return nil, err
	}
	img := &Image{
		Name:         r.Name,
		Digest:       digest,
		BuiltAt:      time.Now().UTC(),
		SizeBytes:    size,
		BuildSeconds: time.Since(start).Seconds(),
		Suite:        suite,
		Mirror:       mirror,
		Recipe:       r,
		Packages:     packages,
		Env:          r.Env,
		Commands:     r.Commands,
		User:         r.User,
		Rootfs:       filepath.Join(s.dir, digest, rootfsDir),
	}
	b.progress(log, r.Name, "built %s: %d packages, %d MiB, in %.1fs",
		digest[:12], len(packages), size>>20, img.BuildSeconds)
	if err := writeImage(tmp, img); err != nil {
		return nil, err
	}
	if err := logFile.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", buildLog, err)
	}
	if err := syncFS(tmp); err != nil {
		return nil, err
	}
	if err := s.install(r.Name, tmp, digest); err != nil {
		return nil, err
	}
	if err := s.setCurrent(r.Name, digest); err != nil {
		return nil, err
	}
	return img, nil
}

// newBuildDir makes a build's temporary directory in the store and opens
// its log there.
func (s *Store) newBuildDir(name string) (string, *os.File, error) {
	tmp, err := os.MkdirTemp(s.dir, buildPrefix+name+".")
	if err != nil {
		return "", nil, err
	}
	// MkdirTemp's 0700 would keep apt's unprivileged _apt user from
	// downloading into the chroot (apt then falls back to root).
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(tmp, buildLog), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return tmp, logFile, nil
}

// buildTree makes the image's root file system at root: mmdebstrap, then
// our files, user and sandbox layout, verified. It returns the installed
// packages and the tree's size.
func (b *Builder) buildTree(ctx context.Context, r *Recipe, suite, mirror, root string, log io.Writer) (map[string]string, int64, error) {
	if err := b.mmdebstrap(ctx, r, suite, mirror, root, log); err != nil {
		return nil, 0, err
	}
	b.progress(log, r.Name, "adding files, user %s and sandbox layout", r.User.Name)
	if err := finalise(root, r); err != nil {
		return nil, 0, err
	}
	if err := verify(ctx, root, r.User); err != nil {
		return nil, 0, fmt.Errorf("verify: %w", err)
	}
	packages, err := installedPackages(ctx, root)
	if err != nil {
		return nil, 0, err
	}
	size, err := diskSize(root)
	if err != nil {
		return nil, 0, err
	}
	return packages, size, nil
}

// install moves a finished build to its digest. A tree already stored under
// that digest (a forced rebuild) is swapped out atomically and discarded.
func (s *Store) install(name, tmp, digest string) error {
	final := filepath.Join(s.dir, digest)
	err := os.Rename(tmp, final)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("install image: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("install image: replace %s: %w", final, err)
	}
	if err := s.discard(name, tmp); err != nil {
		return fmt.Errorf("install image: remove the replaced tree: %w", err)
	}
	return nil
}

func (b *Builder) progress(w io.Writer, name, format string, args ...any) {
	if w == nil {
		return
	}
	fmt.Fprintf(w, "%s image %s: %s\n", time.Now().Format(time.TimeOnly), name, fmt.Sprintf(format, args...))
}

// mmdebstrap creates the tree at root. Its output goes to log. Cancelling
// ctx sends SIGTERM to its process group, which lets mmdebstrap unmount
// what it mounted in the chroot; SIGKILL follows after killGrace. Whatever
// still is mounted below root afterwards is unmounted before returning, so
// that the caller can delete the tree without reaching into /proc or /dev.
func (b *Builder) mmdebstrap(ctx context.Context, r *Recipe, suite, mirror, root string, log io.Writer) error {
	args := []string{"--mode=root", "--variant=" + r.Variant, "--format=directory"}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	for _, opt := range dpkgExcludes {
		args = append(args, "--dpkgopt="+opt)
	}
	// From bookworm on, init-system-helpers depends on "usrmerge |
	// usr-is-merged" and apt picks usrmerge, which brings perl (a third of
	// a minbase tree) to convert a tree that is merged already. This hook,
	// shipped with mmdebstrap, sets up merged /usr itself and installs
	// usr-is-merged instead when the suite has it.
	if _, err := os.Stat(mergedUsrHooks); err == nil {
		args = append(args, "--hook-dir="+mergedUsrHooks)
	}
	if len(r.Setup) > 0 {
		args = append(args, "--customize-hook="+setupHook(r))
	}
	args = append(args, "--", suite, root, mirror)

	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = buildEnv()
	cmd.Stdout = log
	cmd.Stderr = log
	// Dies with the daemon; its children (apt, dpkg, hooks) carry the
	// daemon's marker, and a restarted daemon ends them (pkg/lifetime).
	cmd.SysProcAttr = lifetime.DieWithParent()
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGTERM) }
	cmd.WaitDelay = killGrace
	fmt.Fprintf(log, "+ mmdebstrap %s\n", strings.Join(args, " "))
	runErr := cmd.Run()
	if cmd.Process != nil {
		// Sweep up children (apt, dpkg, hooks) the leader left behind. The
		// group id cannot have been reused while any of them lives.
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	}
	umErr := unmountAll(root)
	if runErr != nil {
		if ctx.Err() != nil {
			runErr = fmt.Errorf("%w (%w)", ctx.Err(), runErr)
		}
		return errors.Join(fmt.Errorf("mmdebstrap: %w", runErr), umErr)
	}
	return umErr
}

// buildEnv is mmdebstrap's environment: a fixed one, so that builds do not
// depend on who started the daemon, plus the host's proxy settings, which
// the mirror may need.
func buildEnv() []string {
	env := []string{
		"PATH=" + chrootPath,
		"HOME=/root",
		"LC_ALL=C.UTF-8",
		"DEBIAN_FRONTEND=noninteractive",
	}
	for _, k := range proxyVars {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return lifetime.Inherit(env)
}

var proxyVars = []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"}

// setupHook returns the mmdebstrap customize hook running the recipe's setup
// lines. mmdebstrap runs it with `sh -c` and the chroot as $1, with /proc,
// /sys and /dev mounted and the package lists still present. The script is
// passed inline, single-quoted, rather than as a file: nothing has to be
// copied in and removed again, and no path needs quoting.
func setupHook(r *Recipe) string {
	var script strings.Builder
	for _, k := range sortedKeys(r.Env) {
		fmt.Fprintf(&script, "export %s=%s\n", k, shellQuote(r.Env[k]))
	}
	for _, line := range r.Setup {
		script.WriteString(line)
		script.WriteByte('\n')
	}
	env := []string{"env", "-i"}
	for _, kv := range buildEnv() {
		env = append(env, shellQuote(kv))
	}
	run := fmt.Sprintf(`chroot "$1" /usr/bin/%s /bin/sh -euc %s sandboxd-setup </dev/null`,
		strings.Join(env, " "), shellQuote(script.String()))
	if _, err := os.Stat(hostCABundle); err != nil {
		return run
	}
	// Setup lines that fetch over TLS (npm, pip) trust what the host
	// trusts: behind a TLS-intercepting egress proxy the host's bundle
	// holds the proxy's CA, which the fresh tree's does not. The bundle is
	// there only while setup runs and is not part of the image.
	in := "/tmp/.sandboxd-host-ca.crt"
	for _, k := range []string{"NODE_EXTRA_CA_CERTS", "npm_config_cafile", "SSL_CERT_FILE", "PIP_CERT"} {
		env = append(env, shellQuote(k+"="+in))
	}
	run = fmt.Sprintf(`chroot "$1" /usr/bin/%s /bin/sh -euc %s sandboxd-setup </dev/null`,
		strings.Join(env, " "), shellQuote(script.String()))
	return fmt.Sprintf(`cp %s "$1%s" && { %s; rc=$?; rm -f "$1%s"; exit $rc; }`, hostCABundle, in, run, in)
}

// hostCABundle is the host's CA bundle (Debian's path), lent to setup.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// verify checks that the tree can run a shell as the sandbox user: /bin/sh
// and the user's shell exist, and `id` inside a chroot agrees on the uid.
func verify(ctx context.Context, root string, u UserSpec) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, p := range []string{"bin/sh", strings.TrimPrefix(u.Shell, "/")} {
		fi, err := r.Stat(p)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("/%s is not an executable file", p)
		}
	}
	cmd := exec.CommandContext(ctx, "chroot", root, "/usr/bin/env", "-i", "PATH="+chrootPath,
		"/bin/sh", "-c", `id -u "$0"`, u.Name)
	cmd.SysProcAttr = lifetime.DieWithParent()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("id -u %s in the image: %w: %s", u.Name, err, bytes.TrimSpace(out))
	}
	if got := string(bytes.TrimSpace(out)); got != strconv.Itoa(u.UID) {
		return fmt.Errorf("id -u %s in the image says %q, want %d", u.Name, got, u.UID)
	}
	return nil
}

// installedPackages asks the host's dpkg-query about the tree's package
// database, so the image needs no working chroot for it.
func installedPackages(ctx context.Context, root string) (map[string]string, error) {
	cmd := exec.CommandContext(ctx, "dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"),
		"-W", "-f=${db:Status-Abbrev}\t${Package}\t${Version}\n")
	cmd.SysProcAttr = lifetime.DieWithParent()
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("list packages: %w", err)
	}
	pkgs := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) == 3 && strings.HasPrefix(f[0], "ii") {
			pkgs[f[1]] = f[2]
		}
	}
	return pkgs, sc.Err()
}

// diskSize is the space the tree occupies (allocated blocks, each hard-linked
// file counted once), like du.
func diskSize(root string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure image: %w", err)
	}
	return total, nil
}

func writeImage(dir string, img *Image) error {
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", imageJSON, err)
	}
	if err := os.WriteFile(filepath.Join(dir, imageJSON), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", imageJSON, err)
	}
	return nil
}

// syncFS flushes the file system holding dir, so that a tree is on disk
// before the rename that makes it visible; otherwise a crash could leave a
// complete-looking image with empty files.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
