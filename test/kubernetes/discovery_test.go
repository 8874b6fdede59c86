//go:build kubernetes

package kubernetes

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/kubediscovery"
)

// TestDiscoveryInCluster: pkg/kubediscovery against the real cluster, with
// the gateway ServiceAccount's token (the chart's RBAC) and EndpointSlices
// that the real EndpointSlice controller published for the DaemonSet's
// pod: the node is found, ready, at the node's address; annotating its pod
// drains it and removing the annotation undrains it.
func TestDiscoveryInCluster(t *testing.T) {
	server, ca, token := os.Getenv("KUBE_TEST_SERVER"), os.Getenv("KUBE_TEST_CA"), os.Getenv("KUBE_TEST_TOKEN")
	node, url := os.Getenv("KUBE_TEST_NODE"), os.Getenv("KUBE_TEST_NODE_URL")
	if server == "" || ca == "" || token == "" || node == "" || url == "" {
		t.Fatal("run by scripts/test-kubernetes.sh: KUBE_TEST_SERVER, _CA, _TOKEN, _NODE, _NODE_URL unset")
	}
	client, err := kubernetes.NewForConfig(&rest.Config{Host: server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: ca}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := kubediscovery.New(client, kubediscovery.Config{Namespace: "sandboxes", Service: "sbx-mcp-sandboxd-node"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatalf("discovery as the gateway's ServiceAccount: %v", err)
	}
	wait := func(what string, ok func(kubediscovery.Node) bool) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		for {
			changed := d.Changed()
			nodes, err := d.Nodes(wctx)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if len(nodes) == 1 && nodes[0].Name == node && nodes[0].URL == url && ok(nodes[0]) {
				t.Logf("%s: %+v", what, nodes[0])
				return
			}
			select {
			case <-changed:
			case <-wctx.Done():
				t.Fatalf("%s: nodes %+v", what, nodes)
			}
		}
	}
	wait("ready", func(n kubediscovery.Node) bool { return n.Ready && !n.Draining })
	kubectl(t, "annotate", "pod", "-l", "app.kubernetes.io/component=node", kubediscovery.DrainingAnnotation+"=true")
	wait("drained", func(n kubediscovery.Node) bool { return n.Ready && n.Draining })
	kubectl(t, "annotate", "pod", "-l", "app.kubernetes.io/component=node", kubediscovery.DrainingAnnotation+"-")
	wait("undrained", func(n kubediscovery.Node) bool { return n.Ready && !n.Draining })
}

// kubectl runs kubectl as the administrator (KUBECONFIG) in the namespace.
func kubectl(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("kubectl", append([]string{"-n", "sandboxes"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
}
