// Package e2b drives the built mcp-sandboxd through its E2B-compatible API
// with a client we did not write: the official e2b npm package (pinned by
// package-lock.json, installed by scripts/install-deps.sh), over plain HTTP
// with header routing (E2B_API_URL and E2B_SANDBOX_URL name the daemon's
// e2b.listen), the way a user's program would after changing one URL.
package e2b

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	pe2b "github.com/sandboxrunner/mcp-sandboxd/pkg/e2b"
)

const apiKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// domain is the host-name routing domain the daemon is given; getHost
// names {port}-{id}.e2b.test, and the client sends that Host header to the
// listener (a wildcard DNS record would resolve it there).
const domain = "e2b.test"

// daemon starts a daemon with the E2B listener on a free port; tweak
// changes its e2b section.
func daemon(t *testing.T, tweak ...func(*config.E2B)) (*testenv.Daemon, string) {
	t.Helper()
	d := testenv.NewDaemon(t, "base")
	addr := testenv.FreeAddr(t)
	keys := filepath.Join(t.TempDir(), "e2b-keys")
	if err := os.WriteFile(keys, []byte("# test key\n"+apiKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Config.E2B = config.E2B{Listen: addr, APIKeyFile: keys, Domain: domain}
	for _, f := range tweak {
		f(&d.Config.E2B)
	}
	data, err := config.Marshal(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.CfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d.Start()
	return d, addr
}

// client runs client.mjs in mode and decodes its report into v.
func client(t *testing.T, addr string, v any, args ...string) {
	t.Helper()
	var extraEnv []string
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	dir := filepath.Join(testenv.RepoRoot, "test", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatal("the e2b SDK is not installed: run `npm ci` in test/e2b (scripts/install-deps.sh does)")
	}
	if len(args) == 4 { // bench N REST_URL REST_TOKEN
		args, extraEnv = args[:2], []string{"REST_URL=" + args[2], "REST_TOKEN=" + args[3]}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir = dir
	scheme := "http://"
	if len(args) == 3 && args[0] == "tls" { // tls HOST:PORT CA_FILE
		scheme, extraEnv, args = "https://", []string{"NODE_EXTRA_CA_CERTS=" + args[2]}, args[:2]
	}
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+apiKey, "E2B_API_URL="+scheme+addr, "E2B_SANDBOX_URL="+scheme+addr, "E2B_DOMAIN="+domain)
	cmd.Env = append(cmd.Env, extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var fatal struct {
		Fatal string `json:"fatal"`
	}
	_ = json.Unmarshal(stdout.Bytes(), &fatal)
	if err != nil || fatal.Fatal != "" {
		t.Fatalf("node client.mjs %v: %v\n%s\nreport: %s\nstderr: %s", args, err, fatal.Fatal, stdout.String(), stderr.String())
	}
	t.Logf("client report: %.4000s", stdout.String())
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatalf("client report %.2000q: %v", stdout.String(), err)
	}
}

type sdkError struct {
	Name     string `json:"name"`
	Message  string `json:"message"`
	NotFound bool   `json:"notFound"`
	Auth     bool   `json:"auth"`
	Exit     *int   `json:"exit"`
}

func TestSDK(t *testing.T) {
	d, addr := daemon(t)
	var r struct {
		SandboxID string `json:"sandboxId"`
		Run       struct {
			Stdout, Stderr, OnStdout, OnStderr string
			ExitCode                           int
		} `json:"run"`
		Exit         *sdkError `json:"exit"`
		Envs         string    `json:"envs"`
		EnvsGone     string    `json:"envsGone"`
		Cwd          string    `json:"cwd"`
		Whoami       string    `json:"whoami"`
		Root         string    `json:"root"`
		UserCannot   *sdkError `json:"userCannot"`
		UserCaps     string    `json:"userCaps"`
		Sudo         string    `json:"sudo"`
		SudoExit     *sdkError `json:"sudoExit"`
		Tools        string    `json:"tools"`
		BgPid        int       `json:"bgPid"`
		BgStdout     string    `json:"bgStdout"`
		Listed       bool      `json:"listed"`
		Killed       bool      `json:"killed"`
		BgWait       *sdkError `json:"bgWait"`
		KillAgain    bool      `json:"killAgain"`
		BgDone       string    `json:"bgDone"`
		CloseStdin   string    `json:"closeStdin"`
		Survived     string    `json:"survived"`
		TimeoutErr   *sdkError `json:"timeoutErr"`
		TimeoutMS    int       `json:"timeoutMs"`
		AfterTimeout bool      `json:"afterTimeout"`
		ReadText     string    `json:"readText"`
		ReadBytes    []int     `json:"readBytes"`
		CatText      string    `json:"catText"`
		List         []string  `json:"list"`
		Exists       []bool    `json:"exists"`
		Info         struct {
			Name, Type, Owner, Permissions, Path string
			Size                                 int64
		} `json:"info"`
		Rename       string         `json:"rename"`
		AfterRename  []any          `json:"afterRename"`
		AfterRemove  bool           `json:"afterRemove"`
		MakeDir      []bool         `json:"makeDir"`
		DirInfo      string         `json:"dirInfo"`
		Watch        []string       `json:"watch"`
		PtyKilled    bool           `json:"ptyKilled"`
		Pty          bool           `json:"pty"`
		Host         string         `json:"host"`
		Page         string         `json:"page"`
		EndInSec     int            `json:"endInSec"`
		Metadata     map[string]any `json:"metadata"`
		ListMeta     []string       `json:"listMeta"`
		ListOther    int            `json:"listOther"`
		Metrics      bool           `json:"metrics"`
		Pause        bool           `json:"pause"`
		PausedState  string         `json:"pausedState"`
		PausedList   int            `json:"pausedList"`
		ResumedState string         `json:"resumedState"`
		AfterResume  string         `json:"afterResume"`
		IsRunning    bool           `json:"isRunning"`
		KilledRun    *sdkError      `json:"killedRun"`
		KilledInfo   *sdkError      `json:"killedInfo"`
		KillTwice    bool           `json:"killTwice"`
	}
	client(t, addr, &r, "main", addr)

	ourID, ok := pe2b.FromE2B(r.SandboxID)
	if !ok || strings.ContainsAny(r.SandboxID, "-_") {
		t.Errorf("sandbox id %q is not of lowercase letters and digits mapping to ours", r.SandboxID)
	}
	// The E2B sandbox is an ordinary sandbox: its record (terminated now)
	// is what sandboxctl shows.
	if out := d.MustCtl("inspect", ourID); !strings.Contains(out, "terminated") || !strings.Contains(out, `"e2b.template": "base"`) || !strings.Contains(out, `"e2b.meta.suite": "e2b"`) {
		t.Errorf("sandboxctl get %s: %s", ourID, out)
	}
	if r.Run.Stdout != "hello\n" || r.Run.Stderr != "oops\n" || r.Run.ExitCode != 0 || r.Run.OnStdout != "hello\n" || r.Run.OnStderr != "oops\n" {
		t.Errorf("commands.run: %+v", r.Run)
	}
	if r.Exit == nil || r.Exit.Name != "CommandExitError" || r.Exit.Exit == nil || *r.Exit.Exit != 3 {
		t.Errorf("exit 3: %+v", r.Exit)
	}
	if r.Envs != "bar baz\n" || r.EnvsGone != "[]\n" {
		t.Errorf("envs: %q then %q", r.Envs, r.EnvsGone)
	}
	if r.Cwd != "/tmp\n" {
		t.Errorf("cwd: %q", r.Cwd)
	}
	if r.Whoami != "user\n/home/user\n/home/user\n" {
		t.Errorf("default user: %q", r.Whoami)
	}
	if r.Root != "0\nwrote\n" {
		t.Errorf("user root: %q", r.Root)
	}
	if want := "hi\n0\nuser\npiped\n/root root user\nsudo-was-here\n"; r.Sudo != want {
		t.Errorf("sudo: %q, want %q", r.Sudo, want)
	}
	if r.SudoExit == nil || r.SudoExit.Exit == nil || *r.SudoExit.Exit != 3 {
		t.Errorf("sudo sh -c 'exit 3': %+v, want a CommandExitError with exit 3", r.SudoExit)
	}
	if r.UserCaps != "CapEff:\t0000000000000000\n" {
		t.Errorf("the default user has capabilities: %q", r.UserCaps)
	}
	if r.UserCannot == nil || r.UserCannot.Exit == nil || *r.UserCannot.Exit == 0 {
		t.Errorf("user wrote /etc: %+v", r.UserCannot)
	}
	for _, want := range []string{"GNU bash", "Python 3", "v", "git version"} {
		if !strings.Contains(r.Tools, want) {
			t.Errorf("tools: %q lacks %q", r.Tools, want)
		}
	}
	if r.BgPid <= 1 || r.BgStdout != "got:abc\n" || !r.Listed || !r.Killed || r.KillAgain {
		t.Errorf("background: pid %d stdout %q listed %v killed %v killed again %v", r.BgPid, r.BgStdout, r.Listed, r.Killed, r.KillAgain)
	}
	if r.BgWait == nil || r.BgWait.Name != "CommandExitError" {
		t.Errorf("wait on a killed command: %+v", r.BgWait)
	}
	if r.BgDone != "done\n" || r.CloseStdin != "piped\neof\n" {
		t.Errorf("background wait %q, closeStdin %q", r.BgDone, r.CloseStdin)
	}
	if r.Survived != "survived\n" {
		t.Errorf("a command whose client disconnected: %q", r.Survived)
	}
	if r.TimeoutErr == nil || r.TimeoutErr.Name != "TimeoutError" || r.TimeoutMS > 5000 || r.AfterTimeout {
		t.Errorf("timeoutMs 1000: %+v after %d ms; still running: %v", r.TimeoutErr, r.TimeoutMS, r.AfterTimeout)
	}
	if r.ReadText != "hello file" || !slices.Equal(r.ReadBytes, []int{0, 1, 2, 255}) || r.CatText != "hello fileuser\n" {
		t.Errorf("files: text %q bytes %v cat %q", r.ReadText, r.ReadBytes, r.CatText)
	}
	if !slices.Contains(r.List, "a.txt") || !slices.Contains(r.List, "rel.bin") {
		t.Errorf("list: %v", r.List)
	}
	if !slices.Equal(r.Exists, []bool{true, false}) {
		t.Errorf("exists: %v", r.Exists)
	}
	if r.Info.Name != "a.txt" || r.Info.Type != "file" || r.Info.Size != 10 || r.Info.Owner != "user" || r.Info.Permissions != "-rw-r--r--" || r.Info.Path != "/home/user/a.txt" {
		t.Errorf("getInfo: %+v", r.Info)
	}
	if r.Rename != "/home/user/sub/b.txt" || fmt.Sprint(r.AfterRename) != "[false hello file]" || r.AfterRemove {
		t.Errorf("rename %q, after %v, after remove %v", r.Rename, r.AfterRename, r.AfterRemove)
	}
	if !slices.Equal(r.MakeDir, []bool{true, false}) || r.DirInfo != "dir" {
		t.Errorf("makeDir: %v %q", r.MakeDir, r.DirInfo)
	}
	if !slices.Contains(r.Watch, "write:new.txt") {
		t.Errorf("watchDir events: %v", r.Watch)
	}
	if !r.Pty || !r.PtyKilled {
		t.Errorf("pty: output %v killed %v", r.Pty, r.PtyKilled)
	}
	if r.Host != "8000-"+r.SandboxID+"."+domain || r.Page != "served-from-sandbox" {
		t.Errorf("getHost %q served %q", r.Host, r.Page)
	}
	if r.EndInSec < 100 || r.EndInSec > 125 || r.Metadata["suite"] != "e2b" {
		t.Errorf("setTimeout(120s): ends in %ds; metadata %v", r.EndInSec, r.Metadata)
	}
	if !slices.Equal(r.ListMeta, []string{r.SandboxID}) || r.ListOther != 0 {
		t.Errorf("list by metadata: %v, other %d", r.ListMeta, r.ListOther)
	}
	if !r.Metrics {
		t.Error("getMetrics gave no sample")
	}
	if !r.Pause || r.PausedState != "paused" || r.PausedList != 1 || r.ResumedState != "running" || r.AfterResume != "4\n" {
		t.Errorf("pause %v state %q listed %d, connect: %q, then %q", r.Pause, r.PausedState, r.PausedList, r.ResumedState, r.AfterResume)
	}
	if r.IsRunning || r.KilledRun == nil || r.KilledInfo == nil || !r.KilledInfo.NotFound || r.KillTwice {
		t.Errorf("after kill: running %v, run %+v, getInfo %+v, kill again %v", r.IsRunning, r.KilledRun, r.KilledInfo, r.KillTwice)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

func TestSDKErrors(t *testing.T) {
	d, addr := daemon(t)
	var r struct {
		WrongKey        *sdkError `json:"wrongKey"`
		BadKeyForm      *sdkError `json:"badKeyForm"`
		UnknownSandbox  *sdkError `json:"unknownSandbox"`
		UnknownKill     bool      `json:"unknownKill"`
		UnknownTemplate *sdkError `json:"unknownTemplate"`
		SandboxID       string    `json:"sandboxId"`
		OtherTemplate   string    `json:"otherTemplate"`
		MissingFile     *sdkError `json:"missingFile"`
		UnderFile       *sdkError `json:"underFile"`
		UnderFileLeft   string    `json:"underFileLeft"`
		BadCwd          *sdkError `json:"badCwd"`
		BadUser         *sdkError `json:"badUser"`
		BadToken        *sdkError `json:"badToken"`
		BadTokenFile    *sdkError `json:"badTokenFile"`
		Signed          []any     `json:"signed"`
		SignedAltered   int       `json:"signedAltered"`
		KilledRun       *sdkError `json:"killedRun"`
		KilledWrite     *sdkError `json:"killedWrite"`
	}
	client(t, addr, &r, "errors")
	if r.WrongKey == nil || !r.WrongKey.Auth {
		t.Errorf("wrong key: %+v", r.WrongKey)
	}
	if r.BadKeyForm == nil || !r.BadKeyForm.Auth && !strings.Contains(r.BadKeyForm.Message, "e2b_") {
		t.Errorf("malformed key: %+v", r.BadKeyForm)
	}
	if r.UnknownSandbox == nil || !r.UnknownSandbox.NotFound || r.UnknownKill {
		t.Errorf("unknown sandbox: %+v, kill %v", r.UnknownSandbox, r.UnknownKill)
	}
	if r.UnknownTemplate == nil || !strings.Contains(r.UnknownTemplate.Message, "no-such-template") {
		t.Errorf("unknown template: %+v", r.UnknownTemplate)
	}
	if r.OtherTemplate != "/home/user\n/home/user\nok\n1000\n" {
		t.Errorf("template shell: %q", r.OtherTemplate)
	}
	if r.MissingFile == nil || !r.MissingFile.NotFound {
		t.Errorf("missing file: %+v", r.MissingFile)
	}
	if r.UnderFile == nil || strings.Contains(r.UnderFileLeft, "g.txt") || !strings.HasSuffix(r.UnderFileLeft, "regular") {
		t.Errorf("write under a regular file: %+v; left %q", r.UnderFile, r.UnderFileLeft)
	}
	if r.BadCwd == nil || r.BadUser == nil || r.BadToken == nil || r.BadTokenFile == nil {
		t.Errorf("bad cwd %+v, user %+v, token %+v / %+v", r.BadCwd, r.BadUser, r.BadToken, r.BadTokenFile)
	}
	if fmt.Sprint(r.Signed) != "[200 regular]" || r.SignedAltered != 401 {
		t.Errorf("pre-signed URL: %v, altered: %d", r.Signed, r.SignedAltered)
	}
	if r.KilledRun == nil || r.KilledWrite == nil {
		t.Errorf("killed sandbox: run %+v, write %+v", r.KilledRun, r.KilledWrite)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

func TestSDKTimeout(t *testing.T) {
	d, addr := daemon(t)
	var r struct {
		SandboxID      string    `json:"sandboxId"`
		RunningAtFirst bool      `json:"runningAtFirst"`
		GoneAfterMs    int       `json:"goneAfterMs"`
		Info           *sdkError `json:"info"`
		AutoPaused     bool      `json:"autoPaused"`
		Resumed        string    `json:"resumed"`
		ResumedEndIn   int       `json:"resumedEndIn"`
	}
	client(t, addr, &r, "timeout")
	if !r.RunningAtFirst || r.Info == nil || !r.Info.NotFound || r.GoneAfterMs > 10000 {
		t.Errorf("timeout: %+v", r)
	}
	if !r.AutoPaused || r.Resumed != "kept" || r.ResumedEndIn < 200 {
		t.Errorf("onTimeout pause: paused %v, after connect %q, ends in %ds", r.AutoPaused, r.Resumed, r.ResumedEndIn)
	}
	id, _ := pe2b.FromE2B(r.SandboxID)
	if out := d.MustCtl("inspect", id); !strings.Contains(out, "lifetime") {
		t.Errorf("sandboxctl get %s: %s", id, out)
	}
}

// TestSDKRestart: a command started through the SDK keeps running across a
// daemon restart, and the SDK finds it again by pid (commands.list and
// connect), sends it input and gets its output and exit.
func TestSDKRestart(t *testing.T) {
	d, addr := daemon(t)
	var before struct {
		SandboxID string `json:"sandboxId"`
		PID       int    `json:"pid"`
		Before    string `json:"before"`
	}
	client(t, addr, &before, "restart-before")
	if before.PID <= 0 || before.Before != "tick1\ntick2\ntick3\n" {
		t.Fatalf("before the restart: %+v", before)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("daemon stop: %v", err)
	}
	d.Start()
	var after struct {
		Listed   bool      `json:"listed"`
		Stdout   string    `json:"stdout"`
		ExitCode int       `json:"exitCode"`
		Unknown  *sdkError `json:"unknown"`
	}
	client(t, addr, &after, "restart-after", before.SandboxID+":"+strconv.Itoa(before.PID))
	if !after.Listed {
		t.Error("commands.list after the restart does not show the command")
	}
	// Output from where it stood: the ticks are not replayed.
	if after.Stdout != "got:after-restart\n" || after.ExitCode != 0 {
		t.Errorf("the command after the restart: stdout %q exit %d, want got:after-restart / 0", after.Stdout, after.ExitCode)
	}
	if after.Unknown == nil || !after.Unknown.NotFound {
		t.Errorf("connect to an unknown pid: %+v, want NotFoundError", after.Unknown)
	}
}

// TestBenchmark is the ComputeSDK measure: Sandbox.create() then
// commands.run('node -v'), median of E2B_BENCH_N runs (default 5), beside
// the same through the REST API, alternating, in the same run.
func TestBenchmark(t *testing.T) {
	n := 5
	if v, err := strconv.Atoi(os.Getenv("E2B_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	d, addr := daemon(t)
	var r struct {
		MS       []float64 `json:"ms"`
		RestMS   []float64 `json:"restMs"`
		Node     string    `json:"node"`
		RestNode string    `json:"restNode"`
	}
	client(t, addr, &r, "bench", strconv.Itoa(n), "http://"+d.HTTPAddr, d.Token())
	if len(r.MS) != n || len(r.RestMS) != n || !strings.HasPrefix(r.Node, "v") || r.Node != r.RestNode {
		t.Fatalf("bench: %+v", r)
	}
	e2bMed, restMed := median(r.MS), median(r.RestMS)
	t.Logf("create + node -v, median of %d: E2B SDK %.0f ms, REST %.0f ms, ratio %.2f", n, e2bMed, restMed, e2bMed/restMed)
	// The acceptance bound (issue 21: at most 1.2x REST) is checked on a
	// sample large enough for medians to mean something.
	if n >= 20 && e2bMed > 1.2*restMed {
		t.Errorf("the E2B path takes %.2fx the REST path (at most 1.2x)", e2bMed/restMed)
	}
}

// TestSDKOverTLS serves the E2B listener with a certificate for
// 127.0.0.1 and *.e2b.test: the SDK over https with header routing, and envd
// by host name through TLS (SNI and Host of {port}-{id}.e2b.test).
func TestSDKOverTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2b test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"*." + domain}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	d, addr := daemon(t, func(c *config.E2B) { c.TLSCert, c.TLSKey = certFile, keyFile })
	var r struct {
		SandboxID  string `json:"sandboxId"`
		Run        string `json:"run"`
		Read       string `json:"read"`
		HostHealth any    `json:"hostHealth"`
	}
	client(t, addr, &r, "tls", addr, certFile)
	if r.Run != "over-tls\n" || r.Read != "tls file" || r.HostHealth != float64(204) {
		t.Errorf("over TLS: %+v", r)
	}
	if ids := d.LiveIDs(); len(ids) != 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}
