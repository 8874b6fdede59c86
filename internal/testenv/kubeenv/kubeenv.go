// Package kubeenv gives tests a real Kubernetes control plane — a
// kube-apiserver and etcd started by controller-runtime's envtest, with RBAC
// authorization — from binaries that scripts/kube-assets.sh builds once and
// caches outside the repository (envtest cannot download them here).
//
// There is no kubelet, scheduler or controller manager: a test creates the
// pods and EndpointSlices it needs by hand, which is exactly what the
// discovery code reads.
package kubeenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// Env is a running control plane.
type Env struct {
	env *envtest.Environment
	// Admin is a rest config of a cluster administrator (system:masters).
	Admin *rest.Config
	// Client is a clientset over Admin.
	Client kubernetes.Interface
}

var (
	assetsOnce sync.Once
	assetsDir  string
	assetsErr  error
)

// Assets returns the directory of kube-apiserver and etcd: KUBEBUILDER_ASSETS
// when set, else what scripts/kube-assets.sh prints after building (or
// finding) them in its cache.
func Assets(t testing.TB) string {
	t.Helper()
	assetsOnce.Do(func() {
		if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
			assetsDir = d
			return
		}
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "kube-assets.sh")
		var stderr bytes.Buffer
		cmd := exec.Command(script)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			assetsErr = err
			assetsDir = stderr.String()
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		assetsDir = lines[len(lines)-1]
	})
	if assetsErr != nil {
		testenv.SkipOrFail(t, "scripts/kube-assets.sh: %v\n%s", assetsErr, assetsDir)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assetsDir, b)); err != nil {
			testenv.SkipOrFail(t, "no %s in %s: %v", b, assetsDir, err)
		}
	}
	return assetsDir
}

// Start starts a control plane for t and stops it (removing its data and
// certificates) when t ends. It needs no root, but -short skips it: it
// takes seconds and, on a new machine, minutes to build the binaries.
func Start(t *testing.T) *Env {
	t.Helper()
	if testing.Short() && os.Getenv("SANDBOXD_INTEGRATION") != "1" {
		t.Skip("kube-apiserver test skipped in -short mode")
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: Assets(t),
		// Two shared cores: the defaults (20 s) are too short under load.
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: start kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest: stop: %v", err)
		}
	})
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return &Env{env: env, Admin: cfg, Client: client}
}

// ServiceAccountConfig returns a rest config that authenticates (with a
// client certificate) as namespace/name's service account and its groups,
// so that what it may do is decided by RBAC alone, as for a pod of that
// account.
func (e *Env) ServiceAccountConfig(t *testing.T, namespace, name string) *rest.Config {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}, nil)
	if err != nil {
		t.Fatalf("envtest: add user: %v", err)
	}
	return u.Config()
}
