package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// tenantsClient runs tenants.mjs with key as E2B_API_KEY.
func tenantsClient(t *testing.T, addr, key string, v any, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"tenants.mjs"}, args...)...)
	cmd.Dir = filepath.Join(testenv.RepoRoot, "test", "e2b")
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_DOMAIN="+domain)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var fatal struct {
		Fatal string `json:"fatal"`
	}
	err := cmd.Run()
	_ = json.Unmarshal(stdout.Bytes(), &fatal)
	if err != nil || fatal.Fatal != "" {
		t.Fatalf("node tenants.mjs %v: %v %s\nstderr: %s", args, err, fatal.Fatal, stderr.String())
	}
	t.Logf("tenants.mjs %v: %.2000s", args, stdout.String())
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatal(err)
	}
}

type outcome struct {
	OK       bool            `json:"ok"`
	Value    json.RawMessage `json:"value"`
	Name     string          `json:"name"`
	NotFound bool            `json:"notFound"`
	Auth     bool            `json:"auth"`
	Message  string          `json:"message"`
}

// TestTenantsSDK: through the official SDK, tenant B cannot get, connect
// to, extend or kill tenant A's sandbox (each not found, as for an id that
// does not exist) nor list it; the e2b.api_key_file key (an admin) sees
// it; a bad key is refused as unauthenticated.
func TestTenantsSDK(t *testing.T) {
	d, addr := daemon(t)
	key := func(name string) string {
		var k struct {
			Secret string `json:"secret"`
		}
		if err := json.Unmarshal([]byte(d.MustCtl("--json", "keys", "create", name)), &k); err != nil || k.Secret == "" {
			t.Fatalf("keys create %s: %v", name, err)
		}
		return k.Secret
	}
	a, b := key("tenant-a"), key("tenant-b")

	var ra struct {
		ID   string   `json:"id"`
		Run  string   `json:"run"`
		List []string `json:"list"`
	}
	tenantsClient(t, addr, a, &ra, "a")
	if ra.Run != "mine" || !slices.Contains(ra.List, ra.ID) {
		t.Fatalf("tenant A: %+v", ra)
	}
	var rb struct {
		Info, Connect, SetTimeout, Kill outcome
		List                            []string
	}
	tenantsClient(t, addr, b, &rb, "b", ra.ID)
	for name, o := range map[string]outcome{"getInfo": rb.Info, "connect": rb.Connect, "setTimeout": rb.SetTimeout} {
		if !o.NotFound {
			t.Errorf("tenant B %s of A's sandbox: %+v, want NotFoundError", name, o)
		}
	}
	// Sandbox.kill answers false for a sandbox that is not there.
	if !rb.Kill.OK || string(rb.Kill.Value) != "false" {
		t.Errorf("tenant B kill of A's sandbox: %+v, want false (not found)", rb.Kill)
	}
	if slices.Contains(rb.List, ra.ID) {
		t.Errorf("tenant B lists A's sandbox: %v", rb.List)
	}
	var radmin struct {
		List []string `json:"list"`
		Info outcome  `json:"info"`
	}
	tenantsClient(t, addr, apiKey, &radmin, "admin", ra.ID)
	if !slices.Contains(radmin.List, ra.ID) || !radmin.Info.OK {
		t.Errorf("admin: %+v", radmin)
	}
	var rbad struct {
		List, Create outcome
	}
	tenantsClient(t, addr, "e2b_"+"ffffffffffffffffffffffffffffffffffffffff", &rbad, "bad")
	if !rbad.List.Auth || !rbad.Create.Auth {
		t.Errorf("bad key: %+v", rbad)
	}
	// A's sandbox survived B's kill.
	var again struct {
		List []string `json:"list"`
		Info outcome  `json:"info"`
	}
	tenantsClient(t, addr, apiKey, &again, "admin", ra.ID)
	if !again.Info.OK {
		t.Errorf("A's sandbox after B's kill: %+v", again.Info)
	}
}
