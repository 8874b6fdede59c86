package kubediscovery

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv/kubeenv"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// TestConfigRefused: every field is validated, hostile values included,
// with invalid_argument and the field's name.
func TestConfigRefused(t *testing.T) {
	client := fake.NewClientset()
	good := Config{Namespace: "sbx", Service: "rel-mcp-sandboxd-node"}
	if _, err := New(client, good); err != nil {
		t.Fatalf("good config refused: %v", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"namespace", func(c *Config) { c.Namespace = "" }},
		{"namespace", func(c *Config) { c.Namespace = "../kube-system" }},
		{"namespace", func(c *Config) { c.Namespace = strings.Repeat("a", 64) }},
		{"service", func(c *Config) { c.Service = "Node" }},
		{"service", func(c *Config) { c.Service = "x,kubernetes.io/service-name=kubernetes" }},
		{"port_name", func(c *Config) { c.PortName = "http port" }},
		{"port_name", func(c *Config) { c.PortName = "a-very-long-port-name" }},
		{"scheme", func(c *Config) { c.Scheme = "file" }},
		{"resync", func(c *Config) { c.Resync = -time.Second }},
	} {
		c := good
		tc.edit(&c)
		_, err := New(client, c)
		if !errdefs.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: got %v, want invalid_argument naming %s", c, err, tc.field)
		}
	}
	if _, err := New(nil, good); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("nil client: %v", err)
	}
}

// TestNodesBeforeStart: no list, no answer — never an empty fleet that a
// gateway would take for "no nodes".
func TestNodesBeforeStart(t *testing.T) {
	d, err := New(fake.NewClientset(), Config{Namespace: "sbx", Service: "node"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Nodes(context.Background()); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("Nodes before Start: %v, want unavailable", err)
	}
}

const (
	ns      = "sbx"
	release = "rel"
	nodeSvc = "rel-mcp-sandboxd-node"
	gwSA    = "rel-mcp-sandboxd-gateway"
)

// chartObjects renders deploy/helm/mcp-sandboxd with its default values and
// returns its ServiceAccount, Role, RoleBinding and node Service: the test
// runs discovery with exactly the rights the chart grants.
func chartObjects(t *testing.T) (sa *corev1.ServiceAccount, role *rbacv1.Role, rb *rbacv1.RoleBinding, svc *corev1.Service) {
	t.Helper()
	ch, err := loader.Load("../../deploy/helm/mcp-sandboxd")
	if err != nil {
		t.Fatal(err)
	}
	top, err := chartutil.ToRenderValues(ch, map[string]any{}, chartutil.ReleaseOptions{Name: release, Namespace: ns, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		t.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
			if !strings.Contains(doc, "kind:") {
				continue
			}
			obj, _, err := dec.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			switch o := obj.(type) {
			case *corev1.ServiceAccount:
				sa = o
			case *rbacv1.Role:
				role = o
			case *rbacv1.RoleBinding:
				rb = o
			case *corev1.Service:
				if o.Name == nodeSvc {
					svc = o
				}
			}
		}
	}
	if sa == nil || role == nil || rb == nil || svc == nil {
		t.Fatalf("chart lacks the gateway's ServiceAccount, Role, RoleBinding or the node Service")
	}
	return sa, role, rb, svc
}

// TestDiscoveryAgainstAPIServer runs discovery against a real kube-apiserver
// and etcd, as the chart's gateway ServiceAccount (client certificate, RBAC
// from the chart), over pods and EndpointSlices made by hand the way the
// EndpointSlice controller would publish a DaemonSet's daemons.
func TestDiscoveryAgainstAPIServer(t *testing.T) {
	kube := kubeenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kube.Client

	sa, role, rb, svc := chartObjects(t)
	mustCreate(t, func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error { _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); return err })
	mustCreate(t, func() error {
		_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		return err
	})

	// Three daemon pods (one per node) with capacity hints, hostile ones on c.
	pods := map[string]map[string]string{
		"node-a": {CapacityAnnotationPrefix + "max-sandboxes": "40", CapacityAnnotationPrefix + "memory": "64Gi", CapacityAnnotationPrefix + "cpus": "15500m", CapacityAnnotationPrefix + "vm": "true"},
		"node-b": nil,
		"node-c": {CapacityAnnotationPrefix + "max-sandboxes": "1e9", CapacityAnnotationPrefix + "memory": "lots", CapacityAnnotationPrefix + "cpus": "-1", CapacityAnnotationPrefix + "vm": "yes"},
	}
	for name, ann := range pods {
		mustCreate(t, func() error {
			_, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, Labels: svc.Spec.Selector},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mcp-sandboxd", Image: "mcp-sandboxd:dev"}}},
			}, metav1.CreateOptions{})
			return err
		})
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: nodeSvc + "-v4", Labels: map[string]string{discoveryv1.LabelServiceName: nodeSvc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("preview"), Port: ptr.To[int32](7071)},
			{Name: ptr.To("http"), Port: ptr.To[int32](7070)},
		},
		Endpoints: []discoveryv1.Endpoint{
			endpoint("198.18.0.11", "n1", "node-a", true, false),
			endpoint("198.18.0.12", "n2", "node-b", true, false),
			endpoint("198.18.0.13", "n3", "node-c", false, false),
		},
	}
	mustCreate(t, func() error {
		_, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
		return err
	})
	// Another Service's slice in the same namespace: not a node daemon.
	other := slice.DeepCopy()
	other.Name, other.Labels = "other", map[string]string{discoveryv1.LabelServiceName: "other"}
	other.Endpoints = []discoveryv1.Endpoint{endpoint("198.18.0.99", "n9", "", true, false)}
	mustCreate(t, func() error {
		_, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, other, metav1.CreateOptions{})
		return err
	})

	gwClient, err := kubernetes.NewForConfig(kube.ServiceAccountConfig(t, ns, gwSA))
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(gwClient, Config{Namespace: ns, Service: nodeSvc})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := d.Start(runCtx); err != nil {
		t.Fatalf("Start as the gateway's ServiceAccount: %v", err)
	}
	if err := d.Start(runCtx); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Errorf("second Start: %v", err)
	}

	want := []Node{
		{Name: "n1", Pod: "node-a", URL: "http://198.18.0.11:7070", Ready: true, Capacity: Capacity{MaxSandboxes: 40, MemoryBytes: 64 << 30, MilliCPUs: 15500, VM: true}},
		{Name: "n2", Pod: "node-b", URL: "http://198.18.0.12:7070", Ready: true},
		{Name: "n3", Pod: "node-c", URL: "http://198.18.0.13:7070"},
	}
	waitNodes(ctx, t, d, "initial list", want)

	// Drain n2 with the annotation an operator sets (kubectl annotate).
	patch(ctx, t, admin, "node-b", `{"metadata":{"annotations":{"`+DrainingAnnotation+`":"true"}}}`)
	want[1].Draining = true
	waitNodes(ctx, t, d, "n2 drained", want)

	// n3 becomes ready; n1's pod is being replaced: its old endpoint
	// terminates while the new pod's, on the same node, is ready — the
	// ready one wins. An IPv6 slice adds n4.
	slice.Endpoints[2].Conditions.Ready = ptr.To(true)
	slice.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}
	slice.Endpoints = append(slice.Endpoints, endpoint("198.18.0.11", "n1", "node-a2", true, false))
	mustCreate(t, func() error {
		_, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a2", Labels: svc.Spec.Selector},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "mcp-sandboxd", Image: "mcp-sandboxd:dev"}}},
		}, metav1.CreateOptions{})
		return err
	})
	if _, err := admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	v6 := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: nodeSvc + "-v6", Labels: map[string]string{discoveryv1.LabelServiceName: nodeSvc}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](7070)}},
		Endpoints:   []discoveryv1.Endpoint{endpoint("2001:db8::14", "n4", "", true, false)},
	}
	mustCreate(t, func() error {
		_, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, v6, metav1.CreateOptions{})
		return err
	})
	want = []Node{
		{Name: "n1", Pod: "node-a2", URL: "http://198.18.0.11:7070", Ready: true},
		want[1],
		{Name: "n3", Pod: "node-c", URL: "http://198.18.0.13:7070", Ready: true},
		{Name: "n4", URL: "http://[2001:db8::14]:7070", Ready: true},
	}
	waitNodes(ctx, t, d, "replaced pod, ready n3, IPv6 n4", want)

	// A node gone: its endpoint leaves the slice.
	slice.Endpoints = slice.Endpoints[1:]
	if _, err := admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, v6.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	slice.Endpoints = slice.Endpoints[:len(slice.Endpoints)-1] // and node-a2's, n1 is gone
	if _, err := admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNodes(ctx, t, d, "n1 and n4 gone", want[1:3])

	// The chart's RBAC reads and nothing more.
	if _, err := gwClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("gateway lists secrets: %v, want forbidden", err)
	}
	if err := gwClient.CoreV1().Pods(ns).Delete(ctx, "node-b", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("gateway deletes a pod: %v, want forbidden", err)
	}
	if _, err := gwClient.CoreV1().Pods(ns).Patch(ctx, "node-b", "application/merge-patch+json", []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("gateway patches a pod: %v, want forbidden", err)
	}
	if _, err := gwClient.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("gateway lists another namespace's pods: %v, want forbidden", err)
	}
	if _, err := gwClient.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("gateway lists nodes: %v, want forbidden", err)
	}

	// Discovery in a namespace it may not read never syncs: Start reports
	// it when its context ends, Nodes stays unavailable.
	denied, err := New(gwClient, Config{Namespace: "kube-system", Service: nodeSvc})
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
	defer dcancel()
	if err := denied.Start(dctx); !errdefs.Is(err, errdefs.Unavailable) {
		t.Errorf("Start without rights: %v, want unavailable", err)
	}
	if _, err := denied.Nodes(ctx); !errdefs.Is(err, errdefs.Unavailable) {
		t.Errorf("Nodes without rights: %v, want unavailable", err)
	}
}

func endpoint(addr, node, pod string, ready, terminating bool) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(terminating)},
		NodeName:   ptr.To(node),
	}
	if pod != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}
	}
	return ep
}

func patch(ctx context.Context, t *testing.T, c kubernetes.Interface, pod, body string) {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, pod, "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch %s: %v", pod, err)
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatalf("create: %v", err)
	}
}

// waitNodes waits, on discovery's change notifications (no polling), until
// Nodes returns want; it fails with the last list when ctx ends.
func waitNodes(ctx context.Context, t *testing.T, d *Discovery, what string, want []Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []Node
	for {
		changed := d.Changed()
		var err error
		got, err = d.Nodes(ctx)
		if err != nil {
			t.Fatalf("%s: Nodes: %v", what, err)
		}
		if reflect.DeepEqual(got, want) {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%s: nodes\n got %s\nwant %s", what, show(got), show(want))
		}
	}
}

func show(ns []Node) string {
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "\n  %+v", n)
	}
	return b.String()
}
