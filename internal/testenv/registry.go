package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// RegistryVersion is the distribution/distribution release tests run: the
// registry Docker Hub runs, built from its Go module by RegistryBin.
const RegistryVersion = "v3.1.2"

// ToolsDir caches the tools tests build from Go modules (the registry),
// shared across runs like the image cache.
func ToolsDir() string {
	if d := os.Getenv("SANDBOXD_TEST_TOOLS"); d != "" {
		return d
	}
	return "/var/tmp/mcp-sandboxd-test-tools"
}

// RegistryBin returns the registry binary, building it with `go install`
// the first time (scripts/install-deps.sh does the same ahead of time).
func RegistryBin(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(ToolsDir(), "registry-"+RegistryVersion)
	bin := filepath.Join(dir, "registry")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "install", "github.com/distribution/distribution/v3/cmd/registry@"+RegistryVersion)
	cmd.Dir = os.TempDir() // outside this module: install resolves the version on its own
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		SkipOrFail(t, "build the test registry %s: %v\n%s", RegistryVersion, err, out)
	}
	return bin
}

// Registry is a real OCI registry on loopback, serving TLS with a
// certificate of a CA made for it, with htpasswd basic auth when Username
// is set.
type Registry struct {
	Host     string // 127.0.0.1:port, as image references name it
	CAFile   string // PEM of the CA its certificate chains to
	CAPool   *x509.CertPool
	Username string // "" for an anonymous registry
	Password string
	Dir      string
	// TokensIssued counts the tokens a token registry's server issued.
	TokensIssued atomic.Int64
}

// NewRegistry starts a registry for t and stops it (and removes its
// storage) when t ends. auth makes it refuse anonymous access (htpasswd
// basic auth).
func NewRegistry(t testing.TB, auth bool) *Registry {
	t.Helper()
	if auth {
		return startRegistry(t, "htpasswd")
	}
	return startRegistry(t, "")
}

// NewTokenRegistry starts a registry with token auth: it answers 401 with a
// Bearer challenge naming a token server (run by the test, on loopback, with
// the registry's TLS certificate) that issues ES256 tokens for Username and
// Password, as Docker Hub's auth service does.
func NewTokenRegistry(t testing.TB) *Registry {
	t.Helper()
	return startRegistry(t, "token")
}

func startRegistry(t testing.TB, mode string) *Registry {
	t.Helper()
	bin := RegistryBin(t)
	dir := t.TempDir()
	r := &Registry{Host: FreeAddr(t), Dir: dir}
	caPEM, certPEM, keyPEM := testCertificates(t)
	r.CAFile = filepath.Join(dir, "ca.pem")
	for name, data := range map[string][]byte{"ca.pem": caPEM, "cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.CAPool = x509.NewCertPool()
	r.CAPool.AppendCertsFromPEM(caPEM)
	cfgPath := r.writeConfig(t, r.authConfig(t, mode, certPEM, keyPEM))
	logf, exited := runRegistry(t, bin, cfgPath)
	r.waitAnswering(t, logf, exited)
	return r
}

// authConfig sets up the registry's authentication of mode ("": none)
// and returns its section of the registry's configuration.
func (r *Registry) authConfig(t testing.TB, mode string, certPEM, keyPEM []byte) string {
	switch mode {
	case "token":
		r.Username, r.Password = "tester", RandHex(12)
		return r.startTokenServer(t, r.Dir, certPEM, keyPEM)
	case "htpasswd":
		r.Username, r.Password = "tester", RandHex(12)
		hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.Dir, "htpasswd"), []byte(r.Username+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("auth:\n  htpasswd:\n    realm: sandboxd-test\n    path: %s\n", filepath.Join(r.Dir, "htpasswd"))
	}
	return ""
}

// writeConfig writes the registry's configuration (storage in its
// directory, TLS, authCfg) and returns its path.
func (r *Registry) writeConfig(t testing.TB, authCfg string) string {
	dir := r.Dir
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  secret: %s
  tls:
    certificate: %s
    key: %s
%s`, filepath.Join(dir, "data"), r.Host, RandHex(16), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), authCfg)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgPath
}

// runRegistry starts the registry binary with cfgPath, killed when t
// ends; exited closes when it exits. Its output goes to logf.
func runRegistry(t testing.TB, bin, cfgPath string) (logf *os.File, exited chan struct{}) {
	logf, err := os.Create(filepath.Join(filepath.Dir(cfgPath), "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No telemetry: the registry's OpenTelemetry exporters would look for a
	// collector.
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
	})
	return logf, exited
}

// waitAnswering waits (30 s at most) until the registry answers /v2/, with
// its log in the failure when it exits or does not answer.
func (r *Registry) waitAnswering(t testing.TB, logf *os.File, exited chan struct{}) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.CAPool}}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("https://" + r.Host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("registry exited at start:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("registry not answering on %s after 30s: %v\n%s", r.Host, err, log)
		}
	}
}

// Ref is the reference of repo:tag on r.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + strings.TrimPrefix(repoTag, "/") }

// Transport is an HTTP transport that trusts r's CA.
func (r *Registry) Transport() http.RoundTripper {
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.CAPool}}
}

// RegistryName is a DNS name the registries' certificates also cover:
// tests that reach a registry by name point it at 127.0.0.1 with their own
// resolver (no hosts file or DNS server of the machine's is touched).
const RegistryName = "registry.sandboxd.test"

// testCertificates makes a CA and a certificate it signs for 127.0.0.1,
// localhost and RegistryName.
func testCertificates(t testing.TB) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandboxd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost", RegistryName},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
