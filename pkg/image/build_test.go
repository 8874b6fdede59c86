package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestEnsureShellBuildsOnce(t *testing.T) {
	requireRoot(t)
	r := loadShell(t)
	b := newTestBuilder(t, cachedStore(t), &syncBuffer{})
	digest, err := b.Digest(r)
	if err != nil {
		t.Fatal(err)
	}

	// Two concurrent Ensures, then a third: at most one build between them,
	// none for the third.
	var (
		log  syncBuffer
		wg   sync.WaitGroup
		imgs [2]*Image
		errs [2]error
	)
	start := time.Now()
	for i := range imgs {
		wg.Go(func() {
			imgs[i], errs[i] = newTestBuilder(t, cachedStore(t), &log).Ensure(context.Background(), r)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(log.String(), "building digest"); n > 1 {
		t.Fatalf("concurrent Ensure built %d times", n)
	} else if n == 1 {
		t.Logf("shell image built in %s (%.1fs in the builder), %d MiB, %d packages",
			time.Since(start).Round(100*time.Millisecond), imgs[0].BuildSeconds, imgs[0].SizeBytes>>20, len(imgs[0].Packages))
	}
	var again syncBuffer
	img, err := newTestBuilder(t, cachedStore(t), &again).Ensure(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(again.String(), "building digest") {
		t.Fatal("Ensure rebuilt an unchanged recipe")
	}
	for _, got := range []*Image{imgs[0], imgs[1], img} {
		if got.Digest != digest || !got.BuiltAt.Equal(img.BuiltAt) {
			t.Fatalf("Ensure returned digest %s built %s, want %s built %s", got.Digest, got.BuiltAt, digest, img.BuiltAt)
		}
	}

	cur, err := cachedStore(t).Get("shell")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Digest != digest || cur.Rootfs != filepath.Join(testImagesDir(), digest, "rootfs") {
		t.Fatalf("Get(shell) = %s at %s", cur.Digest, cur.Rootfs)
	}
}

func TestShellImageContents(t *testing.T) {
	requireRoot(t)
	img := ensureCached(t, loadShell(t))
	root := img.Rootfs

	for _, pkg := range []string{"bash", "coreutils", "procps", "ca-certificates", "apt"} {
		if img.Packages[pkg] == "" {
			t.Errorf("package %s missing from the image's package list", pkg)
		}
	}
	if _, ok := img.Packages["keyutils"]; ok {
		t.Error("keyutils is installed")
	}
	if img.Env["LANG"] != "C.UTF-8" || img.User.Name != "sandbox" || len(img.Commands["version"]) == 0 {
		t.Errorf("metadata: env %v, user %+v, commands %v", img.Env, img.User, img.Commands)
	}

	mustContain := map[string]string{
		"etc/passwd":           "sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\n",
		"etc/group":            "sandbox:x:1000:\n",
		"etc/shadow":           "sandbox:!:",
		"etc/hosts":            "127.0.0.1\tlocalhost\n",
		"etc/apt/sources.list": "deb " + img.Mirror + " " + img.Suite + " main",
	}
	for file, want := range mustContain {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), want) {
			t.Errorf("/%s lacks %q:\n%s", file, want, data)
		}
	}
	for _, file := range []string{"etc/hostname", "etc/resolv.conf"} {
		if fi, err := os.Lstat(filepath.Join(root, file)); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			t.Errorf("/%s should be an empty file: %v %v", file, fi, err)
		}
	}

	owned := []struct {
		path    string
		uid     uint32
		mode    os.FileMode
		isDir   bool
		regular bool
	}{
		{"usr/bin/bash", 0, 0o755, false, true},
		{"home/sandbox", 1000, 0o755, true, false},
		{"home/sandbox/.bashrc", 1000, 0o644, false, true},
		{"workspace", 1000, 0o755, true, false},
		{"workspace/input", 1000, 0o755, true, false},
		{"workspace/output", 1000, 0o755, true, false},
		{".sandboxd", 0, 0o755, true, false},
	}
	for _, o := range owned {
		fi, err := os.Lstat(filepath.Join(root, o.path))
		if err != nil {
			t.Error(err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != o.uid || fi.Mode().Perm() != o.mode || fi.IsDir() != o.isDir || fi.Mode().IsRegular() != o.regular {
			t.Errorf("/%s: uid %d mode %s, want uid %d mode %s", o.path, st.Uid, fi.Mode(), o.uid, o.mode)
		}
	}

	for _, dir := range []string{"dev", "var/lib/apt/lists", "var/cache/apt/archives"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() && e.Name() != "lock" || dir == "dev" {
				t.Errorf("/%s holds %s", dir, e.Name())
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "usr/share/man/man1/bash.1.gz")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("manual pages were installed: %v", err)
	}
	for _, f := range []string{"build.log", "image.json"} {
		if _, err := os.Stat(filepath.Join(filepath.Dir(root), f)); err != nil {
			t.Error(err)
		}
	}
	if fi, err := os.Stat(filepath.Dir(root)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("image directory: %v %v", fi, err)
	}
}

// TestRecipeFilesEnvSetup builds a recipe using every field: files from both
// places, env seen by the setup lines, a different user.
func TestRecipeFilesEnvSetup(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "files", "fullrecipe", "greet.sh"), "#!/bin/sh\necho hello\n")
	writeFile(t, filepath.Join(dir, "shared.conf"), "shared=1\n")
	writeFile(t, filepath.Join(dir, "fullrecipe.yaml"), `
name: fullrecipe
description: every recipe field
packages: [procps]
files:
  - {src: greet.sh, dest: /usr/local/bin/greet, mode: 0755}
  - {src: shared.conf, dest: /etc/sandboxd-test/shared.conf}
env:
  GREETING: "it's here"
user: {name: runner, uid: 1234, shell: /bin/bash}
commands:
  run: [greet]
setup:
  - echo "$GREETING" > /etc/greeting
  - test "$(id -u)" = 0
`)
	r, err := LoadRecipe(filepath.Join(dir, "fullrecipe.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	img := ensureCached(t, r)
	root := img.Rootfs

	checks := map[string]string{
		"usr/local/bin/greet":           "#!/bin/sh\necho hello\n",
		"etc/sandboxd-test/shared.conf": "shared=1\n",
		"etc/greeting":                  "it's here\n",
	}
	for file, want := range checks {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil || string(data) != want {
			t.Errorf("/%s = %q, %v; want %q", file, data, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/greet")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("greet: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/sandboxd-test/shared.conf")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("shared.conf: %v %v", fi, err)
	}
	fi, err := os.Stat(filepath.Join(root, "home/runner"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1234 || fi.Sys().(*syscall.Stat_t).Gid != 1234 {
		t.Errorf("home/runner: %v %v", fi, err)
	}
	if img.User.UID != 1234 || img.User.Home != "/home/runner" {
		t.Errorf("user metadata %+v", img.User)
	}
}

func TestFailedBuildLeavesOnlyItsLog(t *testing.T) {
	requireRoot(t)
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &Recipe{Name: "broken", Packages: []string{"sandboxd-no-such-package"}}
	r.applyDefaults()
	_, err = newTestBuilder(t, store, &syncBuffer{}).Build(context.Background(), r)
	if err == nil {
		t.Fatal("building a recipe with a missing package succeeded")
	}
	assertOnlyFailedLog(t, store, "broken", "sandboxd-no-such-package")
}

func TestBuildCancelled(t *testing.T) {
	requireRoot(t)
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &Recipe{Name: "cancelled", Packages: []string{"procps"}}
	r.applyDefaults()
	var log syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once packages are being installed, when the chroot has
		// /proc and /sys mounted.
		for !strings.Contains(log.String(), "installing") {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	_, err = newTestBuilder(t, store, &log).Build(ctx, r)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Build after cancel: %v", err)
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("cancelled build took %s", d)
	}
	assertOnlyFailedLog(t, store, "cancelled", "")
}

// assertOnlyFailedLog checks that a failed build left nothing but its log
// (containing want) in the store: no tree, no link, no mount.
func assertOnlyFailedLog(t *testing.T, s *Store, name, want string) {
	t.Helper()
	if m := mountsBelow(t, s.dir); len(m) > 0 {
		t.Errorf("mounts left behind: %v", m)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case byNameDir, failedDir, lockPrefix + name:
		default:
			t.Errorf("failed build left %s", e.Name())
		}
	}
	if _, err := s.Get(name); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after failed build: %v", err)
	}
	logs, err := filepath.Glob(filepath.Join(s.dir, failedDir, name+"-*.log"))
	if err != nil || len(logs) != 1 {
		t.Fatalf("failed logs %v, %v", logs, err)
	}
	data, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), want) || !strings.Contains(string(data), "build failed") {
		t.Errorf("failed log does not mention %q:\n%s", want, data)
	}
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
