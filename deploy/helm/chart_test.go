package helm

import (
	"fmt"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/e2b"
)

// The Kubernetes release the chart is tested against (make test-kubernetes
// and the envtest binaries of scripts/kube-assets.sh).
const testedKubeVersion = "v1.34.2"

// The Prometheus Operator's kinds decode as strictly as Kubernetes' own.
func init() {
	if err := monitoringv1.AddToScheme(scheme.Scheme); err != nil {
		panic(err)
	}
}

// rendered is one render of the chart: every object decoded strictly, by
// kind and name.
type rendered struct {
	objects map[string]runtime.Object // "Kind/name"
	notes   string
}

func (r rendered) get(t *testing.T, kind, name string) runtime.Object {
	t.Helper()
	o, ok := r.objects[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %q rendered; have %v", kind, name, r.names())
	}
	return o
}

func (r rendered) names() []string {
	var n []string
	for k := range r.objects {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

func (r rendered) ofKind(kind string) []runtime.Object {
	var out []runtime.Object
	for _, k := range r.names() {
		if strings.HasPrefix(k, kind+"/") {
			out = append(out, r.objects[k])
		}
	}
	return out
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load("mcp-sandboxd")
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// render renders the chart as `helm install rel --namespace sbx` would
// (schema validation included) and decodes each object with the
// Kubernetes strict decoder: an unknown or duplicated field, or a kind the
// API does not know, fails.
func render(t *testing.T, values string) (rendered, error) {
	t.Helper()
	ch := loadChart(t)
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "rel", Namespace: "sbx", IsInstall: true}, nil)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return rendered{}, err
	}
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	r := rendered{objects: map[string]runtime.Object{}}
	for name, text := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = text
			continue
		}
		if !strings.HasSuffix(name, ".yaml") {
			t.Fatalf("unexpected file %s in the chart's output", name)
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s: strict decode: %v\n%s", name, err, doc)
			}
			meta, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
			if err != nil {
				t.Fatal(err)
			}
			md, _ := meta["metadata"].(map[string]any)
			key := gvk.Kind + "/" + fmt.Sprint(md["name"])
			if _, dup := r.objects[key]; dup {
				t.Fatalf("%s rendered twice", key)
			}
			if ns, ok := md["namespace"]; ok {
				t.Fatalf("%s sets namespace %v: the chart must follow --namespace", key, ns)
			}
			r.objects[key] = obj
		}
	}
	return r, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func mustRender(t *testing.T, values string) rendered {
	t.Helper()
	r, err := render(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

func TestChartMetadata(t *testing.T) {
	ch := loadChart(t)
	if err := ch.Validate(); err != nil {
		t.Fatalf("chart metadata: %v", err)
	}
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, testedKubeVersion) {
		t.Fatalf("kubeVersion %q excludes the tested %s", ch.Metadata.KubeVersion, testedKubeVersion)
	}
	if ch.Schema == nil {
		t.Fatal("the chart has no values.schema.json")
	}
}

// TestChartDefaults renders the default values and checks what an operator
// relies on: the node daemon's privileges and host state, an update
// strategy that never runs two daemons on a node, the disruption budgets,
// and RBAC that only reads.
func TestChartDefaults(t *testing.T) {
	r := mustRender(t, "")
	want := []string{
		"ConfigMap/rel-mcp-sandboxd", "DaemonSet/rel-mcp-sandboxd-node", "Deployment/rel-mcp-sandboxd-gateway",
		"PodDisruptionBudget/rel-mcp-sandboxd-gateway", "PodDisruptionBudget/rel-mcp-sandboxd-node",
		"Role/rel-mcp-sandboxd-gateway", "RoleBinding/rel-mcp-sandboxd-gateway", "Secret/rel-mcp-sandboxd-admin",
		"Service/rel-mcp-sandboxd-gateway", "Service/rel-mcp-sandboxd-node", "ServiceAccount/rel-mcp-sandboxd-gateway",
	}
	if got := r.names(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rendered objects:\n got %v\nwant %v", got, want)
	}

	ds := r.get(t, "DaemonSet", "rel-mcp-sandboxd-node").(*appsv1.DaemonSet)
	pod := ds.Spec.Template.Spec
	if !pod.HostPID || !pod.HostNetwork {
		t.Errorf("node pod: hostPID=%v hostNetwork=%v, want both (sandboxes outlive the pod; host networking)", pod.HostPID, pod.HostNetwork)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("node pod mounts a service account token; the daemon needs no API access")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("node pod has %d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("node daemon is not privileged")
	}
	if got := strings.Join(c.Command, " "); got != "mcp-sandboxd serve --config /etc/mcp-sandboxd/mcp-sandboxd.yaml" {
		t.Errorf("node command %q", got)
	}
	if c.Image != "mcp-sandboxd:dev" {
		t.Errorf("image %q, want the chart's appVersion as tag", c.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.Name == "POD_IP" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP") {
			t.Error("POD_IP does not come from status.podIP")
		}
	}
	if env["SANDBOXD_SERVER_HTTP_ADDR"] != "$(POD_IP):7070" || env["SANDBOXD_SERVER_PREVIEW_LISTEN"] != "$(POD_IP):7071" {
		t.Errorf("listen addresses %v: want the pod's (node's) own address", env)
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port != intstr.FromString("http") || p.HTTPGet.Path != "/healthz" {
			t.Errorf("probe %+v: want /healthz (unauthenticated) on the http port", p)
		}
	}
	// Readiness runs the daemon's checks through its socket: /readyz
	// needs the token, which probe headers cannot take from the Secret.
	if p := c.ReadinessProbe; p == nil || p.Exec == nil || strings.Join(p.Exec.Command, " ") != "sandboxctl --socket /run/mcp-sandboxd/api.sock health" {
		t.Errorf("readiness probe %+v: want sandboxctl health over the socket", p)
	}

	hostPaths := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, hp := range []struct{ dir, vol string }{
		{"/var/lib/mcp-sandboxd", "state"}, {"/run/mcp-sandboxd", "run"},
		{"/dev", "dev"}, {"/sys/fs/cgroup", "cgroup"},
	} {
		m, ok := mounts[hp.dir]
		if !ok || m.Name != hp.vol {
			t.Errorf("%s is not mounted from volume %q (%+v)", hp.dir, hp.vol, m)
			continue
		}
		if v := hostPaths[hp.vol]; v == nil || v.Path != hp.dir {
			t.Errorf("volume %q is not the host's %s (%+v)", hp.vol, hp.dir, v)
		}
	}
	for _, dir := range []string{"/var/lib/mcp-sandboxd", "/run/mcp-sandboxd"} {
		if p := mounts[dir].MountPropagation; p == nil || *p != corev1.MountPropagationBidirectional {
			t.Errorf("%s: propagation %v, want Bidirectional (sandbox mounts must outlive the pod)", dir, p)
		}
	}
	checkVolumesDeclared(t, "node", pod)

	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxSurge == nil || us.RollingUpdate.MaxSurge.IntValue() != 0 ||
		us.RollingUpdate.MaxUnavailable == nil || us.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("update strategy %+v: want RollingUpdate, maxSurge 0, maxUnavailable 1", us)
	}
	nodeLabels := ds.Spec.Template.Labels
	if !selects(ds.Spec.Selector.MatchLabels, nodeLabels) {
		t.Errorf("DaemonSet selector %v does not select its pods %v", ds.Spec.Selector.MatchLabels, nodeLabels)
	}

	svc := r.get(t, "Service", "rel-mcp-sandboxd-node").(*corev1.Service)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("node Service: clusterIP %q publishNotReady %v, want headless and publishing not-ready daemons", svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if !selects(svc.Spec.Selector, nodeLabels) {
		t.Errorf("node Service selector %v misses the daemon pods %v", svc.Spec.Selector, nodeLabels)
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].Port != 7070 {
		t.Errorf("node Service ports %+v: want http 7070 first", svc.Spec.Ports)
	}

	pdb := r.get(t, "PodDisruptionBudget", "rel-mcp-sandboxd-node").(*policyv1.PodDisruptionBudget)
	// An integer minAvailable: the one budget Kubernetes computes over a
	// DaemonSet's pods (make test-kubernetes checks its status syncs).
	if pdb.Spec.MaxUnavailable != nil || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.Type != intstr.Int ||
		pdb.Spec.MinAvailable.IntValue() != 0 || !selects(pdb.Spec.Selector.MatchLabels, nodeLabels) {
		t.Errorf("node PDB %+v: want an integer minAvailable 0 and no maxUnavailable, over the daemon pods", pdb.Spec)
	}

	dep := r.get(t, "Deployment", "rel-mcp-sandboxd-gateway").(*appsv1.Deployment)
	gpod := dep.Spec.Template.Spec
	if *dep.Spec.Replicas != 2 {
		t.Errorf("gateway replicas %d", *dep.Spec.Replicas)
	}
	if gpod.HostPID || gpod.HostNetwork || gpod.ServiceAccountName != "rel-mcp-sandboxd-gateway" {
		t.Errorf("gateway pod: hostPID %v hostNetwork %v serviceAccount %q", gpod.HostPID, gpod.HostNetwork, gpod.ServiceAccountName)
	}
	gc := gpod.Containers[0]
	if got := strings.Join(gc.Command, " "); got != "mcp-sandboxd gateway --config /etc/mcp-sandboxd/gateway.yaml" {
		t.Errorf("gateway command %q", got)
	}
	sc := gc.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("gateway security context %+v: want unprivileged, read-only root, no capabilities", sc)
	}
	if psc := gpod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("gateway may run as root")
	}
	checkVolumesDeclared(t, "gateway", gpod)
	// The gateway answers every path but /healthz with 401 to a caller
	// without a bearer key, which a kubelet probe is.
	for what, p := range map[string]*corev1.Probe{"liveness": gc.LivenessProbe, "readiness": gc.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
			t.Errorf("gateway %s probe %+v: want GET /healthz, the one path served without a key", what, p)
		}
	}
	gsvc := r.get(t, "Service", "rel-mcp-sandboxd-gateway").(*corev1.Service)
	if gsvc.Spec.Type != corev1.ServiceTypeClusterIP || !selects(gsvc.Spec.Selector, dep.Spec.Template.Labels) || selects(gsvc.Spec.Selector, nodeLabels) {
		t.Errorf("gateway Service %+v selects the wrong pods", gsvc.Spec)
	}
	gpdb := r.get(t, "PodDisruptionBudget", "rel-mcp-sandboxd-gateway").(*policyv1.PodDisruptionBudget)
	if gpdb.Spec.MinAvailable == nil || gpdb.Spec.MinAvailable.IntValue() != 1 || !selects(gpdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
		t.Errorf("gateway PDB %+v", gpdb.Spec)
	}

	checkReadOnlyRBAC(t, r)

	sec := r.get(t, "Secret", "rel-mcp-sandboxd-admin").(*corev1.Secret)
	if tok, gws := sec.Data["token"], sec.Data["gateway-secret"]; len(tok) != 48 || len(gws) != 48 || string(tok) == string(gws) {
		t.Errorf("generated admin token (%d bytes) and gateway secret (%d bytes): want 48 each, different", len(tok), len(gws))
	}
	nodeEnv := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		nodeEnv[e.Name] = e
	}
	if e := nodeEnv["SANDBOXD_NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("node.name does not come from the Kubernetes node name: %+v", e)
	}
	if nodeEnv["SANDBOXD_NODE_GATEWAY_SECRET_FILE"].Value != "/etc/mcp-sandboxd/admin/gateway-secret" {
		t.Errorf("node's gateway secret file %+v", nodeEnv["SANDBOXD_NODE_GATEWAY_SECRET_FILE"])
	}
	for _, p := range []corev1.PodSpec{pod, gpod} {
		if secretOf(p, "admin") != "rel-mcp-sandboxd-admin" {
			t.Errorf("a pod mounts admin secret %q", secretOf(p, "admin"))
		}
	}

	cfg := nodeConfig(t, r)
	if cfg.Server.AuthTokenFile != "/etc/mcp-sandboxd/admin/token" || mounts["/etc/mcp-sandboxd/admin"].Name != "admin" {
		t.Errorf("token file %q is not where the admin Secret is mounted", cfg.Server.AuthTokenFile)
	}
	if cfg.Paths.StateDir != "/var/lib/mcp-sandboxd" || cfg.Paths.RunDir != "/run/mcp-sandboxd" {
		t.Errorf("config paths %+v do not match the hostPath mounts", cfg.Paths)
	}
	if !strings.Contains(r.notes, "rel-mcp-sandboxd-gateway.sbx.svc:80") {
		t.Errorf("NOTES do not name the gateway's address:\n%s", r.notes)
	}
}

// TestChartValues renders non-default values: each must reach the object it
// configures, and the chart's own keys must win over node.config.
func TestChartValues(t *testing.T) {
	r := mustRender(t, `
image: {repository: registry.example/sbx/mcp-sandboxd, tag: "1.2.3"}
adminKey: {existingSecret: fleet-admin}
node:
  port: 9000
  previewPort: 9001
  stateDir: /data/sandboxd
  runDir: /run/sbx
  updateStrategy: {type: OnDelete}
  minAvailable: 2
  sysctls: {user.max_user_namespaces: "28633", net.ipv4.ip_forward: "1"}
  config:
    sandbox: {max_sandboxes: 10, memory: 1G}
    paths: {state_dir: /elsewhere}
    server: {auth_token_file: /tmp/other}
  nodeSelector: {sandboxrunner.dev/node: "true"}
  tolerations: [{key: dedicated, operator: Equal, value: sandboxes, effect: NoSchedule}]
  podAnnotations: {mcp-sandboxd.sandboxrunner.dev/draining: "true"}
gateway:
  replicas: 1
  port: 8443
  service: {type: NodePort, port: 443, nodePort: 30443}
rbac: {create: false}
`)
	for _, absent := range []string{"Secret/rel-mcp-sandboxd-admin", "Role/rel-mcp-sandboxd-gateway", "RoleBinding/rel-mcp-sandboxd-gateway", "PodDisruptionBudget/rel-mcp-sandboxd-gateway"} {
		if _, ok := r.objects[absent]; ok {
			t.Errorf("%s rendered although the values turn it off", absent)
		}
	}
	ds := r.get(t, "DaemonSet", "rel-mcp-sandboxd-node").(*appsv1.DaemonSet)
	pod := ds.Spec.Template.Spec
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate != nil {
		t.Errorf("update strategy %+v, want OnDelete", ds.Spec.UpdateStrategy)
	}
	c := pod.Containers[0]
	if c.Image != "registry.example/sbx/mcp-sandboxd:1.2.3" || c.Ports[0].ContainerPort != 9000 || c.Ports[1].ContainerPort != 9001 {
		t.Errorf("image %q ports %+v", c.Image, c.Ports)
	}
	if secretOf(pod, "admin") != "fleet-admin" {
		t.Errorf("node pod mounts admin secret %q, want the existing fleet-admin", secretOf(pod, "admin"))
	}
	found := false
	for _, v := range pod.Volumes {
		if v.Name == "state" {
			found = v.HostPath != nil && v.HostPath.Path == "/data/sandboxd"
		}
	}
	if !found {
		t.Error("state volume is not the host's /data/sandboxd")
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the sysctl one", len(pod.InitContainers))
	}
	script := pod.InitContainers[0].Command[2]
	for _, line := range []string{`echo "28633" > /proc/sys/user/max_user_namespaces`, `echo "1" > /proc/sys/net/ipv4/ip_forward`} {
		if !strings.Contains(script, line) {
			t.Errorf("sysctl script lacks %q:\n%s", line, script)
		}
	}
	if pod.NodeSelector["sandboxrunner.dev/node"] != "true" || len(pod.Tolerations) != 1 || ds.Spec.Template.Annotations["mcp-sandboxd.sandboxrunner.dev/draining"] != "true" {
		t.Errorf("placement values lost: %v %v %v", pod.NodeSelector, pod.Tolerations, ds.Spec.Template.Annotations)
	}
	pdb := r.get(t, "PodDisruptionBudget", "rel-mcp-sandboxd-node").(*policyv1.PodDisruptionBudget)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.Type != intstr.Int || pdb.Spec.MinAvailable.IntValue() != 2 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("node PDB minAvailable %v maxUnavailable %v: want the integer 2 alone", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	gsvc := r.get(t, "Service", "rel-mcp-sandboxd-gateway").(*corev1.Service)
	if gsvc.Spec.Type != corev1.ServiceTypeNodePort || gsvc.Spec.Ports[0].Port != 443 || gsvc.Spec.Ports[0].NodePort != 30443 {
		t.Errorf("gateway Service %+v", gsvc.Spec)
	}

	cfg := nodeConfig(t, r)
	if cfg.Sandbox.MaxSandboxes != 10 || cfg.Sandbox.Memory != 1<<30 {
		t.Errorf("node.config did not reach the daemon: max_sandboxes %d memory %d", cfg.Sandbox.MaxSandboxes, cfg.Sandbox.Memory)
	}
	if cfg.Paths.StateDir != "/data/sandboxd" || cfg.Paths.RunDir != "/run/sbx" || cfg.Server.AuthTokenFile != "/etc/mcp-sandboxd/admin/token" {
		t.Errorf("node.config overrode the chart's own keys: %+v %q", cfg.Paths, cfg.Server.AuthTokenFile)
	}
	if cfg.Server.Socket != "/run/sbx/api.sock" {
		t.Errorf("socket %q not in the run dir", cfg.Server.Socket)
	}

	gw := r.get(t, "ConfigMap", "rel-mcp-sandboxd").(*corev1.ConfigMap).Data["gateway.yaml"]
	var g map[string]any
	if err := yaml.UnmarshalStrict([]byte(gw), &g); err != nil {
		t.Fatalf("gateway.yaml: %v", err)
	}
	gs, _ := g["gateway"].(map[string]any)
	d, _ := gs["kubernetes"].(map[string]any)
	if gs["listen"] != ":8443" || gs["secret_file"] != "/etc/mcp-sandboxd/admin/gateway-secret" || d["namespace"] != "sbx" || d["service"] != "rel-mcp-sandboxd-node" || d["port_name"] != "http" {
		t.Errorf("gateway.yaml %v", g)
	}
	// The gateway reads it with the daemon's parser, which refuses unknown
	// keys: the chart's gateway must start with it.
	f := t.TempDir() + "/gateway.yaml"
	if err := os.WriteFile(f, []byte(gw), 0o600); err != nil {
		t.Fatal(err)
	}
	gcfg, err := config.Load(f, config.WithLookupEnv(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("mcp-sandboxd gateway refuses the chart's gateway.yaml: %v\n%s", err, gw)
	}
	if k := gcfg.Gateway.Kubernetes; k.Namespace != "sbx" || k.Service != "rel-mcp-sandboxd-node" || k.PortName != "http" || len(gcfg.Gateway.Nodes) != 0 {
		t.Errorf("gateway discovery from the chart: %+v nodes %v", k, gcfg.Gateway.Nodes)
	}
	// The gateway's root is read-only: its SQLite state_db (the default)
	// must sit on a writable volume of its pod, or the gateway exits at
	// start (seen on a real cluster, make test-kubernetes).
	gpod := r.get(t, "Deployment", "rel-mcp-sandboxd-gateway").(*appsv1.Deployment).Spec.Template.Spec
	if !writableDir(gpod, path.Dir(gcfg.Gateway.StateDB)) {
		t.Errorf("gateway.state_db %q: its directory is no writable volume of the gateway pod (mounts %+v)", gcfg.Gateway.StateDB, gpod.Containers[0].VolumeMounts)
	}
}

// writableDir reports whether dir is an emptyDir mounted read-write into
// the pod's first container.
func writableDir(pod corev1.PodSpec, dir string) bool {
	empty := map[string]bool{}
	for _, v := range pod.Volumes {
		empty[v.Name] = v.EmptyDir != nil
	}
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.MountPath == dir && !m.ReadOnly && m.SubPath == "" && empty[m.Name] {
			return true
		}
	}
	return false
}

// TestChartGatewayDisabled: a fleet without the gateway (clients reach
// node daemons directly) renders no gateway objects and no RBAC.
func TestChartGatewayDisabled(t *testing.T) {
	r := mustRender(t, "gateway: {enabled: false, replicas: 2, port: 8080, service: {type: ClusterIP, port: 80}}")
	for _, k := range r.names() {
		if strings.Contains(k, "gateway") {
			t.Errorf("%s rendered with the gateway disabled", k)
		}
	}
	if len(r.ofKind("DaemonSet")) != 1 {
		t.Error("no node DaemonSet")
	}
	if _, ok := r.get(t, "ConfigMap", "rel-mcp-sandboxd").(*corev1.ConfigMap).Data["gateway.yaml"]; ok {
		t.Error("gateway.yaml rendered with the gateway disabled")
	}
}

// TestChartSchemaRefuses: values.schema.json refuses what would render a
// broken or unsafe fleet, naming the field, before anything is installed.
// The sysctl cases are hostile: they would inject shell into the
// privileged init container.
func TestChartSchemaRefuses(t *testing.T) {
	for _, tc := range []struct{ values, field string }{
		{"bogus: 1", "bogus"},
		{"node: {port: 0}", "port"},
		{"node: {port: http}", "port"},
		{"node: {stateDir: var/lib/sbx}", "stateDir"},
		{"node: {stateDir: /}", "stateDir"},
		{"node: {runDir: '/run/a b'}", "runDir"},
		{"node: {updateStrategy: {type: Recreate}}", "type"},
		{"node: {updateStrategy: {type: RollingUpdate, maxUnavailable: 0}}", "maxUnavailable"},
		// A DaemonSet's budget: maxUnavailable and percentages never sync.
		{"node: {maxUnavailable: 1}", "maxUnavailable"},
		{"node: {minAvailable: 50%}", "minAvailable"},
		{"node: {minAvailable: -1}", "minAvailable"},
		{"node: {unknownKey: 1}", "unknownKey"},
		{"node: {config: {sandboxes: {memory: 1G}}}", "sandboxes"},
		{`node: {sysctls: {"kernel.x": "1; rm -rf /"}}`, "kernel.x"},
		{`node: {sysctls: {"../../etc/passwd": "1"}}`, "../../etc/passwd"},
		{`node: {sysctls: {"vm.x": "$(reboot)"}}`, "vm.x"},
		{"adminKey: {value: short}", "value"},
		{"adminKey: {existingSecret: Bad_Name}", "existingSecret"},
		{"gateway: {replicas: -1}", "replicas"},
		{"gateway: {service: {type: ExternalName, port: 80}}", "type"},
		{"monitoring: {serviceMonitor: {interval: soon}}", "interval"},
		{"monitoring: {prometheusRule: {labels: {release: 1}}}", "release"},
		{"monitoring: {alertmanager: {}}", "alertmanager"},
		{"image: {repository: ''}", "repository"},
		{"image: {pullPolicy: Sometimes}", "pullPolicy"},
		{"image: {tag: 'a b'}", "tag"},
		{"rbac: {create: yes please}", "create"},
		{"node: {e2bPort: 70000}", "e2bPort"},
		{"gateway: {service: {type: ClusterIP, port: 80, sessionAffinity: Sticky}}", "sessionAffinity"},
		{"gateway: {e2b: {enabled: true, port: 0}}", "port"},
		{"gateway: {e2b: {enabled: 'true', port: 8081}}", "enabled"},
		{"gateway: {e2b: {enabled: true, port: 8081, domain: 'sbx.example.com/x'}}", "domain"},
		{"gateway: {e2b: {enabled: true, port: 8081, domain: localhost}}", "domain"},
		{"gateway: {e2b: {enabled: true, port: 8081, listen: ':1'}}", "listen"},
		{"gateway: {preview: {enabled: true, port: 8082, url: 'javascript:alert(1)'}}", "url"},
		{"gateway: {preview: {enabled: true, port: 8082, url: 'https://a b'}}", "url"},
		// The store's URL may carry a password: a Secret only.
		{"gateway: {config: {store: {postgres_url: 'postgres://u:pw@db/x'}}}", "config"},
		{"node: {config: {store: {postgres_url: 'postgres://u:pw@db/x'}}}", "store"},
		{"store: {postgres_url: 'postgres://u:pw@db/x'}", "postgres_url"},
		{"store: {postgresUrlSecret: {name: 'Bad Name', key: url}}", "name"},
		{"store: {postgresUrlSecret: {name: db, key: '../x'}}", "key"},
	} {
		_, err := render(t, tc.values)
		if err == nil {
			t.Errorf("%s: rendered, want the schema to refuse it", tc.values)
			continue
		}
		if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error does not name %q as a schema error: %v", tc.values, tc.field, err)
		}
	}
}

// TestChartFleetSettings: the gateway's E2B and preview listeners (and
// the nodes' E2B listener they route to), the PostgreSQL URL from a Secret
// only, and the gateway Service's client affinity (MCP sessions live in one
// replica).
func TestChartFleetSettings(t *testing.T) {
	def := mustRender(t, "")
	dsvc := def.get(t, "Service", "rel-mcp-sandboxd-gateway").(*corev1.Service)
	if dsvc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || len(dsvc.Spec.Ports) != 1 {
		t.Errorf("default gateway Service: affinity %q ports %+v, want ClientIP and http alone", dsvc.Spec.SessionAffinity, dsvc.Spec.Ports)
	}
	if cfg := nodeConfig(t, def); cfg.E2B.Listen != "" {
		t.Errorf("node e2b.listen %q by default, want off", cfg.E2B.Listen)
	}
	for _, o := range []runtime.Object{def.get(t, "DaemonSet", "rel-mcp-sandboxd-node"), def.get(t, "Deployment", "rel-mcp-sandboxd-gateway")} {
		if e := envOf(o, "SANDBOXD_STORE_POSTGRES_URL"); e != nil {
			t.Errorf("%T sets the store URL without store.postgresUrlSecret: %+v", o, e)
		}
	}

	r := mustRender(t, `
node: {e2bPort: 7300}
gateway:
  service: {type: ClusterIP, port: 80, sessionAffinity: None}
  e2b: {enabled: true, port: 9081, domain: sbx.example.com}
  preview: {enabled: true, port: 9082, url: "https://preview.example.com"}
store: {postgresUrlSecret: {name: fleet-db, key: dsn}}
`)
	gsvc := r.get(t, "Service", "rel-mcp-sandboxd-gateway").(*corev1.Service)
	ports := map[string]int32{}
	for _, p := range gsvc.Spec.Ports {
		ports[p.Name] = p.Port
		if p.TargetPort.StrVal != p.Name {
			t.Errorf("gateway Service port %s targets %v, want the pod's port of that name", p.Name, p.TargetPort)
		}
	}
	if gsvc.Spec.SessionAffinity != corev1.ServiceAffinityNone || ports["e2b"] != 9081 || ports["preview"] != 9082 || ports["http"] != 80 {
		t.Errorf("gateway Service affinity %q ports %v", gsvc.Spec.SessionAffinity, ports)
	}
	gdep := r.get(t, "Deployment", "rel-mcp-sandboxd-gateway").(*appsv1.Deployment)
	cports := map[string]int32{}
	for _, p := range gdep.Spec.Template.Spec.Containers[0].Ports {
		cports[p.Name] = p.ContainerPort
	}
	if cports["e2b"] != 9081 || cports["preview"] != 9082 {
		t.Errorf("gateway container ports %v", cports)
	}

	// The gateway's file, through the daemon's own parser.
	gw := r.get(t, "ConfigMap", "rel-mcp-sandboxd").(*corev1.ConfigMap).Data["gateway.yaml"]
	f := t.TempDir() + "/gateway.yaml"
	if err := os.WriteFile(f, []byte(gw), 0o600); err != nil {
		t.Fatal(err)
	}
	gcfg, err := config.Load(f, config.WithLookupEnv(func(string) (string, bool) { return "", false }))
	if err != nil {
		t.Fatalf("mcp-sandboxd gateway refuses the chart's gateway.yaml: %v\n%s", err, gw)
	}
	if g := gcfg.Gateway; g.E2BListen != ":9081" || g.E2BDomain != "sbx.example.com" || g.PreviewListen != ":9082" || g.PreviewURL != "https://preview.example.com" {
		t.Errorf("gateway listeners from the chart: e2b %q %q preview %q %q", g.E2BListen, g.E2BDomain, g.PreviewListen, g.PreviewURL)
	}

	// Each node serves E2B on its own address, with a key file the
	// daemon accepts, from the admin Secret.
	cfg := nodeConfig(t, r)
	if cfg.E2B.Listen != "192.0.2.7:7300" || cfg.E2B.APIKeyFile != "/etc/mcp-sandboxd/admin/e2b-keys" {
		t.Errorf("node e2b %+v, want the pod's address, port 7300 and the Secret's key file", cfg.E2B)
	}
	ds := r.get(t, "DaemonSet", "rel-mcp-sandboxd-node").(*appsv1.DaemonSet)
	items := map[string]bool{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "admin" && v.Secret != nil {
			for _, it := range v.Secret.Items {
				items[it.Key] = it.Path == it.Key
			}
		}
	}
	if !items["e2b-keys"] {
		t.Errorf("the node pod does not mount the admin Secret's e2b-keys: %v", items)
	}
	keys := string(r.get(t, "Secret", "rel-mcp-sandboxd-admin").(*corev1.Secret).Data["e2b-keys"])
	kf := t.TempDir() + "/e2b-keys"
	if err := os.WriteFile(kf, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := e2b.ReadKeys(kf); err != nil || len(got) != 1 {
		t.Errorf("the Secret's e2b-keys %q: %v %v, want one key the daemon reads", keys, got, err)
	}

	// The store's URL: from the Secret into both, never in the ConfigMap.
	for _, o := range []runtime.Object{ds, gdep} {
		e := envOf(o, "SANDBOXD_STORE_POSTGRES_URL")
		if e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != "fleet-db" || e.ValueFrom.SecretKeyRef.Key != "dsn" {
			t.Errorf("%T: SANDBOXD_STORE_POSTGRES_URL %+v, want secretKeyRef fleet-db/dsn", o, e)
		}
	}
	for k, v := range r.get(t, "ConfigMap", "rel-mcp-sandboxd").(*corev1.ConfigMap).Data {
		if strings.Contains(v, "postgres") {
			t.Errorf("ConfigMap %s names the store:\n%s", k, v)
		}
	}
}

// envOf is the first container's variable name of a DaemonSet or
// Deployment, nil when unset.
func envOf(o runtime.Object, name string) *corev1.EnvVar {
	var pod corev1.PodSpec
	switch v := o.(type) {
	case *appsv1.DaemonSet:
		pod = v.Spec.Template.Spec
	case *appsv1.Deployment:
		pod = v.Spec.Template.Spec
	}
	for i, e := range pod.Containers[0].Env {
		if e.Name == name {
			return &pod.Containers[0].Env[i]
		}
	}
	return nil
}

// TestChartAdminKeyGiven: a given token lands in the Secret unchanged.
func TestChartAdminKeyGiven(t *testing.T) {
	tok := strings.Repeat("k", 40)
	r := mustRender(t, "adminKey: {value: "+tok+"}")
	if got := string(r.get(t, "Secret", "rel-mcp-sandboxd-admin").(*corev1.Secret).Data["token"]); got != tok {
		t.Errorf("token %q, want the given one", got)
	}
}

// checkReadOnlyRBAC: the only rules are namespaced get/list/watch on pods
// and EndpointSlices, bound to the gateway's ServiceAccount only.
func checkReadOnlyRBAC(t *testing.T, r rendered) {
	t.Helper()
	if len(r.ofKind("ClusterRole")) != 0 || len(r.ofKind("ClusterRoleBinding")) != 0 {
		t.Error("the chart grants cluster-wide rights")
	}
	allowed := map[string]bool{"/pods": true, "discovery.k8s.io/endpointslices": true}
	for _, o := range r.ofKind("Role") {
		role := o.(*rbacv1.Role)
		if len(role.Rules) == 0 {
			t.Errorf("role %s has no rules", role.Name)
		}
		for _, rule := range role.Rules {
			verbs := append([]string(nil), rule.Verbs...)
			sort.Strings(verbs)
			if !reflect.DeepEqual(verbs, []string{"get", "list", "watch"}) {
				t.Errorf("role %s grants verbs %v, want exactly get/list/watch", role.Name, rule.Verbs)
			}
			if len(rule.ResourceNames) != 0 || len(rule.NonResourceURLs) != 0 {
				t.Errorf("unexpected rule %+v", rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					if !allowed[g+"/"+res] {
						t.Errorf("role %s grants %s/%s", role.Name, g, res)
					}
				}
			}
		}
	}
	for _, o := range r.ofKind("RoleBinding") {
		rb := o.(*rbacv1.RoleBinding)
		if rb.RoleRef.Kind != "Role" || len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != "rel-mcp-sandboxd-gateway" || rb.Subjects[0].Namespace != "sbx" {
			t.Errorf("binding %s: %+v %+v", rb.Name, rb.RoleRef, rb.Subjects)
		}
	}
}

// checkVolumesDeclared: every mount names a volume of the pod.
func checkVolumesDeclared(t *testing.T, what string, pod corev1.PodSpec) {
	t.Helper()
	vols := map[string]bool{}
	for _, v := range pod.Volumes {
		vols[v.Name] = true
	}
	for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				t.Errorf("%s: container %s mounts undeclared volume %q", what, c.Name, m.Name)
			}
			if !path.IsAbs(m.MountPath) {
				t.Errorf("%s: mount path %q", what, m.MountPath)
			}
		}
	}
}

func secretOf(pod corev1.PodSpec, volume string) string {
	for _, v := range pod.Volumes {
		if v.Name == volume && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// nodeConfig parses the rendered daemon configuration with the daemon's own
// parser (unknown keys and bad values fail there as at start-up), with the
// environment the DaemonSet sets (and only that: not this process's), for a
// pod whose address is 192.0.2.7.
func nodeConfig(t *testing.T, r rendered) *config.Config {
	t.Helper()
	ds := r.get(t, "DaemonSet", "rel-mcp-sandboxd-node").(*appsv1.DaemonSet)
	env := map[string]string{"POD_IP": "192.0.2.7"}
	for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = os.Expand(strings.ReplaceAll(strings.ReplaceAll(e.Value, "$(", "${"), ")", "}"), func(k string) string { return env[k] })
		}
	}
	cm := r.get(t, "ConfigMap", "rel-mcp-sandboxd").(*corev1.ConfigMap)
	data, ok := cm.Data["mcp-sandboxd.yaml"]
	if !ok {
		t.Fatal("ConfigMap has no mcp-sandboxd.yaml")
	}
	f := t.TempDir() + "/mcp-sandboxd.yaml"
	if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(f, config.WithLookupEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	if err != nil {
		t.Fatalf("the daemon refuses the chart's configuration: %v\n%s", err, data)
	}
	if port := ds.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort; cfg.Server.HTTPAddr != fmt.Sprintf("192.0.2.7:%d", port) {
		t.Errorf("daemon listens on %q, want the pod's address and port %d", cfg.Server.HTTPAddr, port)
	}
	return cfg
}

// TestChartMonitoring: the ServiceMonitor and the PrometheusRule are off by
// default; on, the ServiceMonitor scrapes the node Service's http port with
// the admin key (the daemons' /metrics is admin only) as job mcp-sandboxd,
// the job the rules' SandboxdDown selects, and the PrometheusRule holds
// exactly deploy/prometheus/rules.yaml, the rules promtool tests.
func TestChartMonitoring(t *testing.T) {
	def := mustRender(t, "")
	if got := append(def.ofKind("ServiceMonitor"), def.ofKind("PrometheusRule")...); len(got) != 0 {
		t.Fatalf("monitoring objects rendered by default: %v", def.names())
	}

	source, err := os.ReadFile("../prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile("mcp-sandboxd/files/sandboxd.rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(copied) != string(source) {
		t.Fatal("mcp-sandboxd/files/sandboxd.rules.yaml differs from deploy/prometheus/rules.yaml: cp ../prometheus/rules.yaml mcp-sandboxd/files/sandboxd.rules.yaml")
	}

	r := mustRender(t, `
monitoring:
  serviceMonitor: {enabled: true, interval: 15s, labels: {release: kps}}
  prometheusRule: {enabled: true, labels: {release: kps, role: alert-rules}}
`)
	svc := r.get(t, "Service", "rel-mcp-sandboxd-node").(*corev1.Service)
	sm := r.get(t, "ServiceMonitor", "rel-mcp-sandboxd-node").(*monitoringv1.ServiceMonitor)
	if sm.Labels["release"] != "kps" {
		t.Errorf("ServiceMonitor labels %v lack the values' release: kps", sm.Labels)
	}
	if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) || len(sm.Spec.Selector.MatchExpressions) != 0 {
		t.Errorf("ServiceMonitor selector %v does not select the node Service (labels %v)", sm.Spec.Selector, svc.Labels)
	}
	for _, other := range r.ofKind("Service") {
		if o := other.(*corev1.Service); o.Name != svc.Name && selects(sm.Spec.Selector.MatchLabels, o.Labels) {
			t.Errorf("ServiceMonitor also selects Service %s", o.Name)
		}
	}
	if job := svc.Labels[sm.Spec.JobLabel]; job != "mcp-sandboxd" || !strings.Contains(string(source), `up{job="`+job+`"}`) {
		t.Errorf("job label %q gives job %q; the rules select up{job=\"mcp-sandboxd\"}", sm.Spec.JobLabel, job)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints: %+v", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	var portNames []string
	for _, p := range svc.Spec.Ports {
		portNames = append(portNames, p.Name)
	}
	if ep.Port != "http" || !slices.Contains(portNames, "http") || ep.Path != "/metrics" || string(ep.Interval) != "15s" {
		t.Errorf("endpoint %+v: want port http of %v, /metrics, every 15s", ep, portNames)
	}
	if a := ep.Authorization; a == nil || a.Type != "Bearer" || a.Credentials == nil || a.Credentials.Name != "rel-mcp-sandboxd-admin" || a.Credentials.Key != "token" {
		t.Errorf("endpoint authorization %+v: want the admin Secret's token as a bearer token", ep.Authorization)
	}
	if _, ok := r.objects["Secret/rel-mcp-sandboxd-admin"]; !ok {
		t.Error("the ServiceMonitor's Secret is not rendered")
	}

	pr := r.get(t, "PrometheusRule", "rel-mcp-sandboxd").(*monitoringv1.PrometheusRule)
	if pr.Labels["role"] != "alert-rules" {
		t.Errorf("PrometheusRule labels %v lack the values' role", pr.Labels)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(source, &want); err != nil {
		t.Fatalf("deploy/prometheus/rules.yaml as a PrometheusRule's spec: %v", err)
	}
	if !reflect.DeepEqual(pr.Spec, want) {
		t.Errorf("PrometheusRule spec differs from deploy/prometheus/rules.yaml:\n%+v\nwant\n%+v", pr.Spec, want)
	}
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			alerts = append(alerts, rule.Alert)
		}
	}
	for _, a := range []string{"SandboxdDown", "SandboxdCreateFailures", "SandboxdWarmPoolExhausted", "SandboxdDiskNearlyFull", "SandboxdAuditChainBroken", "SandboxdNodeDrainingTooLong"} {
		if !slices.Contains(alerts, a) {
			t.Errorf("PrometheusRule lacks alert %s; has %v", a, alerts)
		}
	}
}
