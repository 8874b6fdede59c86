package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/network"
)

// netTopology is testenv's simulated host and upstream namespaces with
// the engine tests' servers upstream: HTTP on 198.18.0.2:80 (mux) and DNS
// for pkg.example.test (198.18.0.2) and other.example.test (203.0.113.10,
// a second upstream address).
type netTopology struct {
	*testenv.Topology
	// mux is the upstream HTTP server's; tests may add routes.
	mux *http.ServeMux

	mu        sync.Mutex
	downloads map[string]int // wheel file name → GETs served by the index
}

// indexPackage is a one-module Python package the upstream index serves as
// a wheel (testenv.Wheel) built by the test.
type indexPackage struct{ name, version, code string }

// wheelDownloads says how often the upstream index served a package's
// wheel.
func (tp *netTopology) wheelDownloads(name, version string) int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.downloads[wheelFile(name, version)]
}

func wheelFile(name, version string) string { return name + "-" + version + "-py3-none-any.whl" }

func newNetTopology(t testing.TB, pkgs ...indexPackage) *netTopology {
	t.Helper()
	tp := &netTopology{Topology: testenv.NewTopology(t, "sbx"), downloads: map[string]int{}}
	tp.IP(t, "-n", tp.Upstream, "addr", "add", "203.0.113.10/32", "dev", "lo")

	// "/" answers with the client's address as seen upstream; /simple/ and
	// /files/ are a PEP 503 index with the test's packages, which counts
	// the wheels it serves.
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "client=%s\n", host)
	})
	mux.HandleFunc("/5mib", func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 5<<20))
	})
	for _, p := range pkgs {
		file, whl := wheelFile(p.name, p.version), testenv.Wheel(t, p.name, p.version, p.code)
		mux.HandleFunc("/simple/"+p.name+"/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s">%s</a></body></html>`, file, file)
		})
		mux.HandleFunc("/files/"+file, func(w http.ResponseWriter, r *http.Request) {
			tp.mu.Lock()
			tp.downloads[file]++
			tp.mu.Unlock()
			w.Write(whl)
		})
	}
	tp.mux = mux
	tp.ServeHTTP(t, ":80", mux)
	tp.ServeDNS(t, map[string]string{"pkg.example.test.": testenv.UpstreamAddr, "other.example.test.": "203.0.113.10"})
	return tp
}

// upstreamNetwork is the network config of an engine in the topology's
// host namespace: the upstream DNS server, its own bridge (tests running
// side by side must not share one) and the upstream package index.
func upstreamNetwork(bridge string) func(*config.Config) {
	return func(c *config.Config) {
		c.Network.DNS = []string{"198.18.0.2"}
		c.Network.Bridge = bridge
		c.Network.PackageIndexes.PipIndexURL = "http://pkg.example.test/simple/"
	}
}

// newEngineIn starts a test engine whose network host side lives in ns:
// New runs on this goroutine's thread while it is inside ns.
func newEngineIn(t testing.TB, ns netns.NsHandle, tweak ...func(*config.Config)) *testEnv {
	t.Helper()
	var env *testEnv
	testenv.InNamespace(t, ns, func() { env = newTestEngine(t, tweak...) })
	return env
}

// fetch runs an HTTP GET with bash's /dev/tcp inside the sandbox (commands
// run under /bin/sh, which has no /dev/tcp).
func fetch(host string) string {
	return fmt.Sprintf(`bash -c 'exec 3<>/dev/tcp/%s/80 && printf "GET / HTTP/1.0\r\nHost: %s\r\n\r\n" >&3 && timeout 5 cat <&3'`, host, host)
}

func TestNetworkWithContainers(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t, indexPackage{"greetpkg", "1.0", "def hello():\n    return 'hello from the index'\n"})
	testenv.EnsureImages(t, "shell", "python")
	env := newEngineIn(t, tp.HostNS, upstreamNetwork("sbxt0"), func(c *config.Config) {
		c.Network.Presets = map[string][]string{"testidx": {"pkg.example.test"}}
		c.Network.Bandwidth, c.Network.MaxBandwidth = 100<<20, 200<<20
	})
	ctx := context.Background()
	hostPortStart, err := readSysctlIn(tp.HostNS, "net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		t.Fatal(err)
	}

	// egress: by name, masqueraded; resolv.conf names the gateway; the
	// package index reaches the environment.
	info := env.create(t, CreateSandboxRequest{Network: NetworkEgress})
	res := env.sh(t, info.ID, "cat /etc/resolv.conf; echo PIP=$PIP_INDEX_URL; "+fetch("pkg.example.test"))
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "client=198.18.0.1") ||
		!strings.Contains(res.Stdout, "nameserver 10.88.0.1") || !strings.Contains(res.Stdout, "PIP=http://pkg.example.test/simple/") {
		t.Fatalf("egress sandbox: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	// A normal-mode command (uid 1000, no capabilities) serves on port 80
	// of the sandbox's namespace, which pkg/network made with
	// ip_unprivileged_port_start 0, and the preview path (the agent's
	// connect) reaches it; the simulated host namespace keeps its value.
	web := env.create(t, CreateSandboxRequest{Language: "python", Network: NetworkEgress})
	if res := env.sh(t, web.ID, "id -u; cat /proc/sys/net/ipv4/ip_unprivileged_port_start"); res.Stdout != "1000\n0\n" {
		t.Fatalf("egress sandbox: uid and port start %q %q, want 1000 and 0", res.Stdout, res.Stderr)
	}
	if got := httpThroughAgent(t, env, web.ID, 80, "python3 -m http.server 80 --bind 0.0.0.0"); !strings.HasPrefix(got, "HTTP/1.0 200") {
		t.Fatalf("GET / on port 80 through the agent: %q", got)
	}
	if v, err := readSysctlIn(tp.HostNS, "net/ipv4/ip_unprivileged_port_start"); err != nil || v != hostPortStart {
		t.Fatalf("ip_unprivileged_port_start of the host namespace = %q (%v), was %s", v, err, hostPortStart)
	}

	// run_code installs requirements.txt from the configured index over
	// the network and imports the package.
	run := env.runCode(t, RunCodeRequest{Language: "python", Network: NetworkEgress, Files: map[string]string{
		"main.py":          "import greetpkg\nprint(greetpkg.hello())\n",
		"requirements.txt": "greetpkg\n",
	}})
	if run.Stdout != "hello from the index\n" || !slices.Equal(stepNames(run), []string{StepInstall, StepRun}) || tp.wheelDownloads("greetpkg", "1.0") != 1 {
		t.Fatalf("run_code with requirements.txt from the index: %s", describe(run))
	}
	// The host's address is closed.
	if res := env.sh(t, info.ID, "timeout 2 bash -c 'exec 3<>/dev/tcp/198.18.0.1/22'"); res.ExitCode == 0 {
		t.Fatal("egress sandbox reached the host's own address")
	}

	// A runtime change to an allowlist: the listed name works, another
	// name does not resolve, a direct address is dropped.
	st, err := env.SandboxNetwork(ctx, SandboxNetworkRequest{SandboxID: info.ID, Mode: NetworkAllowlist, Allow: []string{"@testidx"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != NetworkAllowlist || !slices.Equal(st.Allow, []string{"@testidx"}) {
		t.Fatalf("status after the change: %+v", st)
	}
	if res := env.sh(t, info.ID, fetch("pkg.example.test")); res.ExitCode != 0 || !strings.Contains(res.Stdout, "client=") {
		t.Fatalf("allowed name: exit %d %s %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := env.sh(t, info.ID, "getent hosts other.example.test"); res.ExitCode == 0 {
		t.Fatalf("other.example.test resolved: %s", res.Stdout)
	}
	if res := env.sh(t, info.ID, "timeout 2 bash -c 'exec 3<>/dev/tcp/203.0.113.10/80'"); res.ExitCode == 0 {
		t.Fatal("direct connection to a non-allowed address succeeded")
	}
	d, err := env.GetSandbox(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.NetworkStatus == nil || d.NetworkStatus.Counters.Allowed == 0 || d.NetworkStatus.Counters.Denied == 0 ||
		!slices.Contains(d.NetworkStatus.Counters.DeniedDestinations, "203.0.113.10") ||
		!slices.Contains(d.NetworkStatus.Counters.DeniedDestinations, "other.example.test") || d.Network != NetworkAllowlist {
		t.Fatalf("sandbox_get network: %s %+v", d.Network, d.NetworkStatus)
	}

	// The counters are in /metrics too.
	mfs, err := env.MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var denied float64
	for _, mf := range mfs {
		if mf.GetName() != "sandboxd_sandbox_connection_attempts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["sandbox_id"] == info.ID && labels["verdict"] == "denied" {
				denied = m.GetCounter().GetValue()
			}
		}
	}
	if denied != float64(d.NetworkStatus.Counters.Denied) || denied == 0 {
		t.Fatalf("/metrics denied attempts of %s = %v, sandbox_get says %d", info.ID, denied, d.NetworkStatus.Counters.Denied)
	}

	// none: loopback only, and it cannot change.
	none := env.create(t, CreateSandboxRequest{})
	if res := env.sh(t, none.ID, "ls /sys/class/net"); strings.TrimSpace(res.Stdout) != "lo" {
		t.Fatalf("none sandbox links: %q", res.Stdout)
	}
	if _, err := env.SandboxNetwork(ctx, SandboxNetworkRequest{SandboxID: none.ID, Mode: NetworkEgress}); !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("changing a none sandbox: %v", err)
	}
	// Bad input names its field.
	for _, c := range []struct {
		req   CreateSandboxRequest
		field string
	}{
		{CreateSandboxRequest{Network: NetworkNone, Allow: []string{"pkg.example.test"}}, "allow"},
		{CreateSandboxRequest{Network: NetworkAllowlist, Allow: []string{"10.0.0.0/33"}}, "allow[0]"},
		{CreateSandboxRequest{Network: NetworkAllowlist, Allow: []string{"bad host"}}, "allow[0]"},
	} {
		_, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Network: c.req.Network, Allow: c.req.Allow})
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), c.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", c.req, err, c.field)
		}
	}

	// Network limits: the cap, and the field on a none sandbox.
	big := int64(300 << 20)
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Network: NetworkEgress, NetworkBandwidth: &big}); !errdefs.Is(err, errdefs.LimitExceeded) || !strings.HasPrefix(errdefs.MessageOf(err), "network_bandwidth") {
		t.Errorf("bandwidth above network.max_bandwidth: %v", err)
	}
	if _, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", NetworkBandwidth: &big}); !errdefs.Is(err, errdefs.InvalidArgument) || !strings.HasPrefix(errdefs.MessageOf(err), "network_bandwidth") {
		t.Errorf("bandwidth on a none sandbox: %v", err)
	}
	// 5 MiB at 1 MiB/s through a real container takes 4.5-6 s.
	slow := int64(1 << 20)
	limited := env.create(t, CreateSandboxRequest{Network: NetworkEgress, NetworkBandwidth: &slow})
	if limited.Limits.NetworkBandwidth != slow {
		t.Fatalf("limits = %+v", limited.Limits)
	}
	start := time.Now()
	res = env.sh(t, limited.ID, `bash -c 'exec 3<>/dev/tcp/198.18.0.2/80 && printf "GET /5mib HTTP/1.0\r\n\r\n" >&3 && wc -c <&3'`, 30)
	took := time.Since(start)
	if n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout)); res.ExitCode != 0 || n < 5<<20 {
		t.Fatalf("download in the limited sandbox: %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	t.Logf("5 MiB at 1 MiB/s in a container: %v", took)
	if took < 4500*time.Millisecond || took > 6*time.Second {
		t.Errorf("5 MiB at 1 MiB/s took %v, want 4.5-6 s", took)
	}

	// Terminate: nothing of the network is left in the host namespace.
	for _, id := range []string{info.ID, web.ID, none.ID, limited.ID} {
		if _, err := env.TerminateSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	h, err := netlink.NewHandleAt(tp.HostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, _ := h.LinkList()
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, network.VethPrefix) || n == "sbxt0" {
			t.Errorf("link %s left after terminate", n)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(tp.HostNS)))
	if err != nil {
		t.Fatal(err)
	}
	if tables, _ := c.ListTables(); slices.ContainsFunc(tables, func(tb *nftables.Table) bool { return strings.HasPrefix(tb.Name, network.DefaultTable) }) {
		t.Error("nftables table left after the last sandbox with network")
	}
	if fwd, err := readSysctlIn(tp.HostNS, "net/ipv4/ip_forward"); err != nil || fwd != tp.Forward {
		t.Errorf("ip_forward of the host namespace = %q (%v), want %s restored (the value it started with)", fwd, err, tp.Forward)
	}
	if st, err := env.SandboxNetwork(ctx, SandboxNetworkRequest{SandboxID: info.ID}); !errdefs.Is(err, errdefs.Conflict) {
		t.Errorf("network of a terminated sandbox: %+v %v", st, err)
	}
}

// readSysctlIn reads a /proc/sys file as seen from ns.
func readSysctlIn(ns netns.NsHandle, name string) (string, error) {
	var b []byte
	err := network.InNetNS(ns, func() error {
		var err error
		b, err = os.ReadFile("/proc/sys/" + name)
		return err
	})
	return strings.TrimSpace(string(b)), err
}

// httpThroughAgent starts server in the background in sandbox id, exposes
// port and sends GET / through the agent's connect (DialExposed, the
// preview proxy's path), retrying until the server listens; it returns the
// answer's first line. The server ends with the sandbox.
func httpThroughAgent(t *testing.T, env *testEnv, id string, port int, server string) string {
	t.Helper()
	ctx := context.Background()
	job, err := env.StartJob(ctx, ExecRequest{SandboxID: id, Command: server})
	if err != nil {
		t.Fatal(err)
	}
	// Exposures need the preview listener's address only for the URLs
	// they return; nothing here goes through the listener.
	env.SetPreviewURL("http://127.0.0.1:1")
	if _, err := env.ExposePort(ctx, ExposePortRequest{SandboxID: id, Port: port}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := env.DialExposed(ctx, id, port)
		if err == nil {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				t.Fatalf("read from port %d: %v", port, err)
			}
			return strings.TrimSpace(line)
		}
		st, serr := env.JobStatus(ctx, JobStatusRequest{SandboxID: id, JobID: job})
		if serr != nil || st.State != "running" || !errdefs.Is(err, errdefs.Unavailable) || time.Now().After(deadline) {
			t.Fatalf("connect to port %d: %v; server job: %+v %v", port, err, st, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A restarted daemon adopts a sandbox with network: its address, rules
// and the DNS forwarder come back, and its traffic still flows.
func TestNetworkAdoptedAfterRestart(t *testing.T) {
	requireRoot(t)
	tp := newNetTopology(t)
	testenv.EnsureImages(t, "shell")
	cfg := testenv.Config(t, "netrs")
	upstreamNetwork("sbxt1")(cfg)
	ctx := context.Background()
	var e1, e2 *Engine
	var err error
	testenv.InNamespace(t, tp.HostNS, func() { e1, err = New(ctx, cfg, testenv.Logger(t)) })
	if err != nil {
		t.Fatal(err)
	}
	info, err := e1.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Network: NetworkEgress})
	if err != nil {
		t.Fatal(err)
	}
	e1.sandboxes.Close()
	_ = e1.Close() // sandboxes and their network stay

	testenv.InNamespace(t, tp.HostNS, func() { e2, err = New(ctx, cfg, testenv.Logger(t)) })
	if err != nil {
		t.Fatal(err)
	}
	env := watchEngine(t, e2, cfg)
	res := env.sh(t, info.ID, fetch("pkg.example.test"))
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "client=198.18.0.1") {
		t.Fatalf("adopted sandbox: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if _, err := e2.TerminateSandbox(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(tp.HostNS)))
	if err != nil {
		t.Fatal(err)
	}
	if tables, _ := c.ListTables(); slices.ContainsFunc(tables, func(tb *nftables.Table) bool { return strings.HasPrefix(tb.Name, network.DefaultTable) }) {
		t.Error("nftables table left after the adopted sandbox was terminated")
	}
}

// BenchmarkCreateNetwork: create→ready of a shell sandbox with network none
// versus egress, medians in one run (docs/network.md "Measurements").
// Run with: go test -tags seccomp -run '^$' -bench CreateNetwork -benchtime 10x ./pkg/engine
func BenchmarkCreateNetwork(b *testing.B) {
	requireRoot(b)
	tp := newNetTopology(b)
	env := newEngineIn(b, tp.HostNS, upstreamNetwork("sbxt2"))
	ctx := context.Background()
	times := map[string][]time.Duration{}
	for b.Loop() {
		for _, mode := range []string{NetworkNone, NetworkEgress} {
			start := time.Now()
			info, err := env.CreateSandbox(ctx, CreateSandboxRequest{Language: "shell", Network: mode})
			if err != nil {
				b.Fatal(err)
			}
			times[mode] = append(times[mode], time.Since(start))
			if _, err := env.TerminateSandbox(ctx, info.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, mode := range []string{NetworkNone, NetworkEgress} {
		b.ReportMetric(ms(median(times[mode])), "ms-create-"+mode)
	}
}
