package image

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fakeTree writes the few files of a Debian tree that finalise touches.
func fakeTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n")
	writeFile(t, filepath.Join(root, "etc/group"), "root:x:0:\nshadow:x:42:") // no final newline
	writeFile(t, filepath.Join(root, "etc/shadow"), "root:*:19000:0:99999:7:::\n")
	writeFile(t, filepath.Join(root, "etc/skel/.profile"), "# profile\n")
	writeFile(t, filepath.Join(root, "dev/null"), "")
	if err := os.MkdirAll(filepath.Join(root, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestFinalise(t *testing.T) {
	requireRoot(t)
	root := fakeTree(t)
	// mmdebstrap leaves absolute symlinks in a tree; finalise must replace
	// them, never write through them to the host.
	host := filepath.Join(t.TempDir(), "host-resolv.conf")
	writeFile(t, host, "nameserver 192.0.2.53\n")
	if err := os.Symlink(host, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	recipes := t.TempDir()
	writeFile(t, filepath.Join(recipes, "motd"), "hello\n")
	r := &Recipe{Name: "t", Dir: recipes, Files: []FileSpec{{Src: "motd", Dest: "/etc/motd.d/hello", Mode: 0o4750}}}
	r.applyDefaults()

	if err := finalise(root, r); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(host); string(data) != "nameserver 192.0.2.53\n" {
		t.Fatalf("finalise wrote through a symlink to the host: %q", data)
	}
	want := map[string]string{
		"etc/passwd":            "root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
		"etc/group":             "root:x:0:\nshadow:x:42:\nsandbox:x:1000:\n",
		"etc/shadow":            "root:*:19000:0:99999:7:::\nsandbox:!::0:99999:7:::\n",
		"etc/resolv.conf":       "",
		"etc/hostname":          "",
		"etc/hosts":             hostsFile,
		"etc/motd.d/hello":      "hello\n",
		"home/sandbox/.profile": "# profile\n",
	}
	for file, content := range want {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil || string(data) != content {
			t.Errorf("/%s = %q, %v; want %q", file, data, err, content)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "etc/motd.d/hello")); err != nil || fi.Mode()&(os.ModePerm|os.ModeSetuid) != 0o750|os.ModeSetuid {
		t.Errorf("installed file mode: %v %v", fi, err)
	}
	if entries, err := os.ReadDir(filepath.Join(root, "dev")); err != nil || len(entries) != 0 {
		t.Errorf("/dev not emptied: %v %v", entries, err)
	}
	for _, d := range []string{"home/sandbox", "home/sandbox/.profile", "workspace", "workspace/input", "workspace/output"} {
		fi, err := os.Lstat(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("/%s owned by %d:%d", d, st.Uid, st.Gid)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, ".sandboxd")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Errorf("/.sandboxd: %v %v", fi, err)
	}
}

func TestFinaliseRefusesEscapes(t *testing.T) {
	requireRoot(t)
	root := fakeTree(t)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "opt")); err != nil {
		t.Fatal(err)
	}
	recipes := t.TempDir()
	writeFile(t, filepath.Join(recipes, "x"), "x")
	r := &Recipe{Name: "t", Dir: recipes, Files: []FileSpec{{Src: "x", Dest: "/opt/x"}}}
	r.applyDefaults()
	if err := finalise(root, r); err == nil || !strings.Contains(err.Error(), "files[0]") {
		t.Errorf("finalise through an escaping symlink: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("finalise wrote outside the tree: %v", entries)
	}
}

func TestFinaliseUserConflict(t *testing.T) {
	requireRoot(t)
	root := fakeTree(t)
	writeFile(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n")
	r := &Recipe{Name: "t"}
	r.applyDefaults()
	err := finalise(root, r)
	if err == nil || !strings.Contains(err.Error(), "already uses id 1000") {
		t.Errorf("finalise with uid 1000 taken: %v", err)
	}
}
