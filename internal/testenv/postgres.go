package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postgresUID is the user a private cluster runs as when the tests run as
// root: PostgreSQL refuses to run as root, and nobody owns nothing else.
const postgresUID = 65534

// postgresBinDir finds Debian's PostgreSQL server binaries
// (/usr/lib/postgresql/<major>/bin, the newest major), which are not on PATH.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server (initdb) under /usr/lib/postgresql/*/bin or on PATH; scripts/install-deps.sh installs Debian's postgresql")
}

func majorOf(dir string) int {
	var n int
	fmt.Sscanf(filepath.Base(filepath.Dir(dir)), "%d", &n)
	return n
}

// Postgres starts a private PostgreSQL cluster for t and returns a
// connection URL for its database "postgres" (user postgres, trust
// authentication). The cluster lives in a temporary directory, listens on
// a unix socket in it only (listen_addresses is empty: no TCP port to
// clash with another test or helper), runs as an unprivileged user, and
// is stopped and removed when t ends. No PostgreSQL installed: skip, or
// fail under SANDBOXD_INTEGRATION=1.
func Postgres(t testing.TB) string {
	t.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		SkipOrFail(t, "%v", err)
	}
	// Not t.TempDir: its parents are root's 0700 directories, which the
	// unprivileged server cannot traverse.
	dir, err := os.MkdirTemp("", "sandboxd-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	for _, d := range []string{data, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(d, postgresUID, postgresUID); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "LC_ALL=C", "TZ=UTC"}
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: postgresUID, Gid: postgresUID}}
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("postgres: %s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
	}
	run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	opts := fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories=%s -c fsync=off -c max_connections=60 -c shared_buffers=16MB", sock)
	run("pg_ctl", "-D", data, "-l", filepath.Join(data, "server.log"), "-o", opts, "-w", "-t", "60", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "-t", "30", "stop")
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: postgresUID, Gid: postgresUID}}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("postgres: stop: %v\n%s", err, out)
		}
		// pg_ctl -w returned: the postmaster is gone; its pid file too.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); os.IsNotExist(err) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("postgres: %s/postmaster.pid still there after stop", data)
	})
	return "postgres://postgres@/postgres?host=" + sock + "&sslmode=disable"
}
