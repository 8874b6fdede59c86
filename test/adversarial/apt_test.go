package adversarial

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
)

// mirrorHost is the name of the Debian mirror the topology's upstream
// serves.
const mirrorHost = "deb.example.test"

// The mirror serves a real Debian package, hello (small, a compiled
// program whose dependency libc6 the image has), and greetPackage, built
// by the test, which depends on hello: installing it makes apt resolve
// and fetch a dependency from the mirror.
const (
	mirrorPackage = "hello"
	greetPackage  = "sandboxd-greet"
)

// aptFromMirror: a root-mode sandbox whose network reaches only the mirror
// points apt at it (signed-by the test's key, the image's own sources
// removed), runs apt-get update and install, and runs the programs. apt
// downloads as its _apt user, which the sandbox's user namespace maps: the
// HTTP method fetching the download is, seen from the host, the sandbox's
// range start + _apt's uid, not root and not the sandbox's root.
func aptFromMirror(t *testing.T, tp *testenv.Topology, e *engine.Engine, r *apitypes.Sandbox) {
	t.Helper()
	facts := mustExec(t, e, r.ID, ". /etc/os-release; echo $VERSION_CODENAME; dpkg --print-architecture; id -u _apt")
	f := strings.Fields(facts.Stdout)
	if len(f) != 3 {
		t.Fatalf("root mode: suite, architecture and _apt uid of the image: %q %q", facts.Stdout, facts.Stderr)
	}
	suite, arch, aptUID := f[0], f[1], f[2]
	greet := testenv.BuildDebianPackage(t, "Package: "+greetPackage+"\nVersion: 1.0\nArchitecture: all\n"+
		"Maintainer: sandboxd tests <repo@example.test>\nDepends: "+mirrorPackage+" (>= 2.10)\nDescription: greets through hello\n",
		map[string]string{"usr/bin/" + greetPackage: "#!/bin/sh\nexec hello -g 'hello from the mirror'\n"})
	repo := testenv.NewAptRepository(t, suite, arch, testenv.DebianPackage(t, mirrorPackage), greet)

	// The mirror: the repository's files under /debian/, each GET counted;
	// while a .deb is being asked for, the host uids of the sandbox's apt
	// HTTP methods (the process asking) are recorded.
	var mu sync.Mutex
	served := map[string]int{}
	var methodUIDs [][]int
	files := http.StripPrefix("/debian/", http.FileServer(http.Dir(repo.Root)))
	mux := http.NewServeMux()
	mux.Handle("/debian/", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		served[req.URL.Path]++
		if strings.HasSuffix(req.URL.Path, ".deb") {
			for _, pid := range sandboxProcs(t, r.ID, "http") {
				if ids, err := procIDs(pid, "Uid:"); err == nil {
					methodUIDs = append(methodUIDs, ids)
				}
			}
		}
		mu.Unlock()
		files.ServeHTTP(w, req)
	}))
	tp.ServeHTTP(t, ":80", mux)

	script := fmt.Sprintf(`set -e
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
mkdir -p /etc/apt/keyrings
echo %s | base64 -d > /etc/apt/keyrings/sandboxd-test.gpg
echo "deb [signed-by=/etc/apt/keyrings/sandboxd-test.gpg] http://%s/debian %s main" > /etc/apt/sources.list.d/local.list
apt-get update -q >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
apt-get install -y -q --no-install-recommends %[4]s >>/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
%[4]s; %[5]s
dpkg-query -W -f='${Package} ${Status}\n' %[5]s %[4]s`, base64.StdEncoding.EncodeToString(repo.Keyring), mirrorHost, suite, greetPackage, mirrorPackage)
	res := mustExec(t, e, r.ID, script)
	log := mustExec(t, e, r.ID, "cat /tmp/apt.log").Stdout
	want := "hello from the mirror\nHello, world!\n" + mirrorPackage + " install ok installed\n" + greetPackage + " install ok installed\n"
	if res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("root mode: apt-get install %s from the mirror: exit %d %q %q\napt: %s", greetPackage, res.ExitCode, res.Stdout, res.Stderr, log)
	}
	// apt says when it cannot drop to _apt ("Download is performed
	// unsandboxed as root") and when a signature does not verify; neither
	// may happen.
	for _, bad := range []string{"unsandboxed", "NO_PUBKEY", "not signed", "W:", "E:"} {
		if strings.Contains(log, bad) {
			t.Errorf("root mode: apt's output has %q:\n%s", bad, log)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	inRelease := "/debian/dists/" + suite + "/InRelease"
	debs, _ := filepath.Glob(filepath.Join(repo.Root, "pool", "main", "*.deb"))
	if len(debs) != 2 {
		t.Fatalf("the repository's pool: %v", debs)
	}
	for _, p := range append(debs, inRelease) {
		if p != inRelease {
			p = "/debian/pool/main/" + filepath.Base(p)
		}
		if served[p] != 1 {
			t.Errorf("the mirror served %s %d times, want once (all it served: %v)", p, served[p], served)
		}
	}

	// The HTTP method that fetched the .deb ran as _apt of the sandbox: the
	// sandbox's root (its agent) + _apt's uid on the host.
	agents := sandboxProcs(t, r.ID, "agent")
	if len(agents) == 0 {
		t.Fatal("root mode: no agent process seen from the host")
	}
	agent := statusIDs(t, agents[0], "Uid:")[0]
	n, _ := strconv.Atoi(aptUID)
	if len(methodUIDs) == 0 {
		t.Fatalf("no apt HTTP method of %s seen from the host while it downloaded the package", r.ID)
	}
	for _, ids := range methodUIDs {
		for _, u := range ids {
			if u != agent+n {
				t.Errorf("apt's HTTP method ran as host uids %v, want %d (the sandbox's range start %d + _apt %d)", ids, agent+n, agent, n)
				break
			}
		}
	}
	t.Logf("root mode: apt-get installed %s and its dependency %s from the mirror; its downloads ran as _apt (uid %d inside, host uid %d)", greetPackage, mirrorPackage, n, agent+n)
}

// procIDs returns the four ids of a /proc/PID/status line ("Uid:").
func procIDs(pid, key string) ([]int, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 5 && f[0] == key {
			var out []int
			for _, s := range f[1:] {
				n, _ := strconv.Atoi(s)
				out = append(out, n)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("/proc/%s/status has no %s line", pid, key)
}
