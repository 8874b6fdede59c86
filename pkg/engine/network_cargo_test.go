package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

const cargoCratePath = "/cargo/dl/greetrs/1.0.0/download"

// addCargoRegistry serves upstream a cargo registry with one crate: a git
// index (config.json and the crate's index line) over git's dumb HTTP
// protocol (static files after update-server-info), and the .crate file
// at the index's dl address. Debian bookworm's cargo (0.66) has no sparse
// protocol, so the index is git, fetched with the git CLI.
func addCargoRegistry(t *testing.T, tp *netTopology, reg *upstreamRegistries) {
	t.Helper()
	crate := npmTarball(t, map[string]string{
		"greetrs-1.0.0/Cargo.toml": "[package]\nname = \"greetrs\"\nversion = \"1.0.0\"\nedition = \"2021\"\n",
		"greetrs-1.0.0/src/lib.rs": "pub fn hello() -> &'static str { \"hello from the cargo registry\" }\n",
	})
	sum := sha256.Sum256(crate)
	line, err := json.Marshal(map[string]any{
		"name": "greetrs", "vers": "1.0.0", "deps": []any{}, "cksum": hex.EncodeToString(sum[:]),
		"features": map[string]any{}, "yanked": false,
	})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	for name, content := range map[string]string{
		"config.json":   `{"dl": "http://pkg.example.test/cargo/dl", "api": "http://pkg.example.test/cargo"}`,
		"gr/ee/greetrs": string(line) + "\n",
	} {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bare := filepath.Join(t.TempDir(), "index.git")
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.test", "-c", "init.defaultBranch=master"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git(work, "init", "-q")
	git(work, "add", ".")
	git(work, "commit", "-q", "-m", "index")
	git(work, "clone", "-q", "--bare", work, bare)
	git(bare, "repack", "-a", "-d", "-q")
	git(bare, "update-server-info")
	tp.mux.Handle("/cargo/index.git/", http.StripPrefix("/cargo/index.git/", http.FileServer(http.Dir(bare))))
	tp.mux.HandleFunc(cargoCratePath, reg.serve(cargoCratePath, "application/octet-stream", crate))
}

// TestNetworkInstallsCargo: run_code rust with a Cargo.toml naming a crate
// fetches it over the network from a registry upstream (named by the
// project's .cargo/config.toml: cargo's registry replacement is a config
// file, not an environment variable, so network.package_indexes has no
// cargo key) and uses it.
func TestNetworkInstallsCargo(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t)
	reg := &upstreamRegistries{served: map[string]int{}}
	addCargoRegistry(t, tp, reg)
	testenv.EnsureImages(t, "shell", "rust")
	env := newEngineIn(t, tp.HostNS, upstreamNetwork("sbxt"+randHex(2)))

	run := env.runCode(t, RunCodeRequest{Language: "rust", Network: NetworkEgress, Entrypoint: "src/main.rs", Files: map[string]string{
		"src/main.rs": "fn main() { println!(\"{}\", greetrs::hello()); }\n",
		"Cargo.toml":  "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ngreetrs = \"1\"\n",
		".cargo/config.toml": "[source.crates-io]\nreplace-with = \"testreg\"\n\n[source.testreg]\nregistry = \"http://pkg.example.test/cargo/index.git\"\n\n" +
			"[net]\ngit-fetch-with-cli = true\n",
	}})
	if run.Stdout != "hello from the cargo registry\n" || reg.count(cargoCratePath) != 1 {
		t.Errorf("run_code rust with Cargo.toml from the registry (crate served %d times): %s", reg.count(cargoCratePath), describe(run))
	}
}
