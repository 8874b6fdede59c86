package engine

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/cgroups"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
)

const engineTestSecret = "sk-ant-test-REAL-0f1e2d3c4b5a69788796a5b4"

// keyRecorder is a fake upstream API that records the key of each
// request and answers with usage.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// serveFakeAPI listens on 198.18.0.2:8088 in the topology's upstream
// namespace.
func serveFakeAPI(t *testing.T, tp *netTopology) *keyRecorder {
	rec := &keyRecorder{}
	tp.ServeHTTP(t, testenv.UpstreamAddr+":8088", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.keys = append(rec.keys, r.Header.Get("x-api-key"))
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","usage":{"input_tokens":7,"output_tokens":3}}`)
	}))
	return rec
}

// callProxy is a shell command that POSTs to $ANTHROPIC_BASE_URL/v1/messages
// (or to url, if given) with bash's /dev/tcp and prints the response.
func callProxy(url string) string {
	if url == "" {
		url = "$ANTHROPIC_BASE_URL"
	}
	return `bash -c 'u=` + url + `; u=${u#http://}; hp=${u%%/*}; p=/${u#*/}; ` +
		`exec 3<>/dev/tcp/${hp%:*}/${hp#*:} && ` +
		`printf "POST %s/v1/messages HTTP/1.0\r\nHost: %s\r\nx-api-key: %s\r\nContent-Length: 2\r\n\r\n{}" "$p" "$hp" "$ANTHROPIC_API_KEY" >&3 && timeout 5 cat <&3'`
}

func TestCredentialsWithContainers(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t)
	api := serveFakeAPI(t, tp)
	secretFile := filepath.Join(t.TempDir(), "anthropic.key")
	if err := os.WriteFile(secretFile, []byte(engineTestSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	env := newEngineIn(t, tp.HostNS, func(c *config.Config) {
		c.Network.DNS = []string{"198.18.0.2"}
		c.Network.Bridge = "sbxc0"
		c.Network.Credentials = map[string]config.Credential{"anthropic": {
			BaseURL: "http://198.18.0.2:8088", Header: "x-api-key", SecretFile: secretFile,
			BaseURLEnv: "ANTHROPIC_BASE_URL", KeyEnv: "ANTHROPIC_API_KEY", MaxRequests: 3,
		}}
	})
	ctx := context.Background()

	// Bad input names the field.
	for _, c := range []struct {
		req   CreateSandboxRequest
		field string
	}{
		{CreateSandboxRequest{Network: NetworkNone, Credentials: []string{"anthropic"}}, "credentials"},
		{CreateSandboxRequest{Network: NetworkEgress, Credentials: []string{"openai"}}, "credentials[0]"},
	} {
		c.req.Language = "shell"
		_, err := env.CreateSandbox(ctx, c.req)
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), c.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", c.req, err, c.field)
		}
	}

	// An allowlist sandbox allowed nothing but granted the credential: the
	// proxy on the gateway is all it reaches, and it gets through.
	sb := env.create(t, CreateSandboxRequest{Network: NetworkAllowlist, Credentials: []string{"anthropic"}})
	res := env.sh(t, sb.ID, "echo URL=$ANTHROPIC_BASE_URL KEY=$ANTHROPIC_API_KEY; "+callProxy(""))
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "URL=http://10.88.0.1:8119/anthropic/") ||
		!strings.Contains(res.Stdout, "KEY="+network.DummyKey) || !strings.Contains(res.Stdout, "200 OK") || !strings.Contains(res.Stdout, `"input_tokens":7`) {
		t.Fatalf("granted sandbox: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if keys := api.seen(); len(keys) != 1 || keys[0] != engineTestSecret {
		t.Fatalf("upstream saw keys %q, want the real one", keys)
	}
	var proxyURL string
	for _, l := range strings.Fields(res.Stdout) {
		if v, ok := strings.CutPrefix(l, "URL="); ok {
			proxyURL = v
		}
	}

	// The secret is nowhere in the sandbox: no process environment, no
	// file in the workspace, home or /tmp (searched from inside, with the
	// secret passed encoded so that it is not in any environment), and no
	// process environment read from the host.
	b64 := base64.StdEncoding.EncodeToString([]byte(engineTestSecret))
	env.sh(t, sb.ID, "sleep 300 >/dev/null 2>&1 & echo started")
	res = env.sh(t, sb.ID, "s=$(echo "+b64+" | base64 -d); grep -l -F \"$s\" /proc/[0-9]*/environ; grep -rlF \"$s\" /workspace /home /tmp /etc; "+
		"echo WITHURL=$(grep -l ANTHROPIC_BASE_URL= /proc/[0-9]*/environ | wc -l)")
	if strings.Contains(res.Stdout, "/") || strings.Contains(res.Stdout, "WITHURL=0") || !strings.Contains(res.Stdout, "WITHURL=") {
		// WITHURL counts the environments holding the proxy's URL: the
		// search does see the sandbox's processes.
		t.Fatalf("the secret is inside the sandbox, or the search saw nothing: %s %s", res.Stdout, res.Stderr)
	}
	d, err := env.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cgroups.Procs(d.CgroupPath)
	if err != nil || len(pids) < 2 {
		t.Fatalf("processes of %s: %v %v", sb.ID, pids, err)
	}
	withURL := 0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue // exited
		}
		if strings.Contains(string(b), engineTestSecret) {
			t.Fatalf("process %d of the sandbox holds the secret in its environment", pid)
		}
		if strings.Contains(string(b), "ANTHROPIC_BASE_URL=") {
			withURL++
		}
	}
	if withURL == 0 {
		t.Fatalf("no process of %s has the proxy's URL: the host-side search read the wrong processes", sb.ID)
	}

	// Another sandbox (with network, without the credential) using this
	// sandbox's URL, and the host namespace with or without the token,
	// are refused; the upstream sees none of them.
	other := env.create(t, CreateSandboxRequest{Network: NetworkEgress})
	if res := env.sh(t, other.ID, callProxy(proxyURL)); !strings.Contains(res.Stdout, "403") || !strings.Contains(res.Stdout, "was not granted") {
		t.Fatalf("other sandbox with the token: %s %s", res.Stdout, res.Stderr)
	}
	for _, u := range []string{proxyURL, "http://10.88.0.1:8119/anthropic"} {
		if st, body := postFrom(t, tp.HostNS, u+"/v1/messages"); st != http.StatusForbidden || !strings.Contains(body, "is not a sandbox") {
			t.Fatalf("host namespace %s: %d %s", u, st, body)
		}
	}
	if n := len(api.seen()); n != 1 {
		t.Fatalf("refused requests reached the upstream (%d requests)", n)
	}

	// The spend cap: max_requests 3.
	for range 2 {
		if res := env.sh(t, sb.ID, callProxy("")); !strings.Contains(res.Stdout, "200 OK") {
			t.Fatalf("request under the cap: %s", res.Stdout)
		}
	}
	res = env.sh(t, sb.ID, callProxy(""))
	if !strings.Contains(res.Stdout, "403") || !strings.Contains(res.Stdout, "spend cap") || !strings.Contains(res.Stdout, "max_requests: 3 of 3") {
		t.Fatalf("request over the cap: %s", res.Stdout)
	}
	d, err = env.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	u := d.CredentialUsage["anthropic"]
	if u.Requests != 3 || u.InputTokens != 21 || u.OutputTokens != 9 || u.Refused != 1 || u.CapReached != "max_requests" {
		t.Fatalf("credential_usage = %+v", d.CredentialUsage)
	}
	if len(d.Credentials) != 1 || d.Env["ANTHROPIC_BASE_URL"] != "" {
		t.Fatalf("sandbox_get shows credentials %v and env %v (the token-bearing URL must not be shown)", d.Credentials, d.Env)
	}

	// Terminated: the proxy is gone with the host side.
	for _, id := range []string{sb.ID, other.ID} {
		if _, err := env.TerminateSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	err = network.InNetNS(tp.HostNS, func() error {
		c, err := net.DialTimeout("tcp4", "10.88.0.1:8119", time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("the credential proxy still listens after the last sandbox went")
	}
}

// postFrom POSTs from a thread inside ns.
func postFrom(t *testing.T, ns netns.NsHandle, rawURL string) (int, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	var status int
	var body string
	if err := network.InNetNS(ns, func() error {
		conn, err := net.DialTimeout("tcp4", u.Host, 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		req, _ := http.NewRequest("POST", rawURL, strings.NewReader("{}"))
		if err := req.Write(conn); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		status, body = resp.StatusCode, string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return status, body
}
