// Package kubediscovery finds the node daemons of a SandboxRunner fleet
// through the Kubernetes API: client-go informers over the EndpointSlices of
// the node daemons' headless Service (deploy/helm: <release>-node) and over
// the pods behind them, turned into a list of nodes with their address,
// readiness, whether they are being drained, and capacity hints.
//
// Kubernetes already runs, restarts and finds the daemons; this package only
// reads what it publishes. It needs get, list and watch on pods and
// EndpointSlices in one namespace, nothing else (the chart's Role): no
// Service, Node or cluster-wide access.
//
// Where a node's facts come from:
//   - name: the Kubernetes node an endpoint is on (one daemon per node under
//     the DaemonSet), else its pod's name;
//   - URL: the endpoint's address and the Service port named Config.PortName;
//   - ready: the endpoint's ready condition and not terminating (the Service
//     publishes not-ready addresses, so a restarting daemon stays listed as
//     not ready instead of vanishing);
//   - draining: the pod annotation DrainingAnnotation = "true", or the pod
//     or endpoint terminating: a gateway places no new sandbox there;
//   - capacity: optional pod annotations (CapacityAnnotationPrefix + name).
package kubediscovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Annotations on a node daemon's pod that this package reads.
const (
	// DrainingAnnotation = "true" marks a node daemon that takes no new
	// sandboxes; its live ones keep running and are still routed to.
	DrainingAnnotation = "mcp-sandboxd.sandboxrunner.dev/draining"
	// CapacityAnnotationPrefix + "max-sandboxes" (an integer), "memory" and
	// "cpus" (Kubernetes quantities: 64Gi, 16, 15500m) and "vm" ("true")
	// are capacity hints for placement. A hint that does not parse is
	// ignored (and logged): the node is still listed.
	CapacityAnnotationPrefix = "capacity.mcp-sandboxd.sandboxrunner.dev/"
)

// Node is one node daemon as the cluster publishes it.
type Node struct {
	// Name is the Kubernetes node name (or the pod's name when the endpoint
	// names no node): stable across restarts of the daemon's pod.
	Name string
	// Pod is the daemon's pod name ("" when the endpoint has no pod).
	Pod string
	// URL is the daemon's base URL, e.g. http://192.0.2.7:7070.
	URL string
	// Ready: the daemon passes its readiness probe and is not terminating.
	Ready bool
	// Draining: no new sandboxes should be placed here.
	Draining bool
	// Capacity holds the hints of the pod's annotations; zero: unknown.
	Capacity Capacity
}

// Capacity is what a node daemon can hold, as far as its pod says.
type Capacity struct {
	MaxSandboxes int   // live sandboxes at once
	MemoryBytes  int64 // memory for sandboxes
	MilliCPUs    int64 // CPU for sandboxes, in thousandths of a core
	VM           bool  // the node offers the vm backend (/dev/kvm)
}

// Config says which Service's daemons to find.
type Config struct {
	// Namespace of the Service and its pods (the gateway's own, usually).
	Namespace string
	// Service is the node daemons' headless Service.
	Service string
	// PortName is the Service port of the daemon's HTTP API; "" means "http".
	PortName string
	// Scheme of the URLs; "" means "http".
	Scheme string
	// Resync is the informers' resync period; 0 means none (watches only).
	Resync time.Duration
	// Logger receives ignored hints; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return errdefs.Invalidf("kubediscovery: namespace %q: %s", c.Namespace, errs[0])
	}
	if errs := validation.IsDNS1035Label(c.Service); len(errs) > 0 {
		return errdefs.Invalidf("kubediscovery: service %q: %s", c.Service, errs[0])
	}
	if c.PortName == "" {
		c.PortName = "http"
	}
	if errs := validation.IsValidPortName(c.PortName); len(errs) > 0 {
		return errdefs.Invalidf("kubediscovery: port_name %q: %s", c.PortName, errs[0])
	}
	switch c.Scheme {
	case "":
		c.Scheme = "http"
	case "http", "https":
	default:
		return errdefs.Invalidf("kubediscovery: scheme %q: want http or https", c.Scheme)
	}
	if c.Resync < 0 {
		return errdefs.Invalidf("kubediscovery: resync %v: must not be negative", c.Resync)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Discovery watches one Service's node daemons. Start it once; Nodes is
// safe for concurrent use.
type Discovery struct {
	cfg     Config
	factory informers.SharedInformerFactory
	slices  listersdiscoveryv1.EndpointSliceLister
	pods    listerscorev1.PodLister
	synced  []cache.InformerSynced
	// The two factories (slices narrowed by label, pods not).
	startFns    []func(<-chan struct{})
	shutdownFns []func()

	mu      sync.Mutex
	started bool
	changed chan struct{}   // closed and replaced on every change
	warned  map[string]bool // pod/annotation=value already logged
}

// New builds a Discovery over client; nothing is read until Start.
func New(client kubernetes.Interface, cfg Config) (*Discovery, error) {
	if client == nil {
		return nil, errdefs.Invalidf("kubediscovery: client: nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Discovery{cfg: cfg, changed: make(chan struct{}), warned: map[string]bool{}}
	// Only this namespace, and only the Service's slices: the label is the
	// one the EndpointSlice controller sets. Pods cannot be narrowed the
	// same way without reading the Service's selector (not granted), so
	// the pod informer sees the namespace's pods and we look up by name.
	d.factory = informers.NewSharedInformerFactoryWithOptions(client, cfg.Resync, informers.WithNamespace(cfg.Namespace))
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(client, cfg.Resync,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + cfg.Service
		}))
	sliceInf := sliceFactory.Discovery().V1().EndpointSlices()
	podInf := d.factory.Core().V1().Pods()
	d.slices = sliceInf.Lister()
	d.pods = podInf.Lister()
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.notify() },
		UpdateFunc: func(any, any) { d.notify() },
		DeleteFunc: func(any) { d.notify() },
	}
	if _, err := sliceInf.Informer().AddEventHandler(notify); err != nil {
		return nil, fmt.Errorf("kubediscovery: endpointslice handler: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(notify); err != nil {
		return nil, fmt.Errorf("kubediscovery: pod handler: %w", err)
	}
	d.synced = []cache.InformerSynced{sliceInf.Informer().HasSynced, podInf.Informer().HasSynced}
	d.startFns = []func(<-chan struct{}){sliceFactory.Start, d.factory.Start}
	d.shutdownFns = []func(){sliceFactory.Shutdown, d.factory.Shutdown}
	return d, nil
}

// NewInCluster builds a Discovery from the pod's service account (the
// gateway's Deployment in deploy/helm).
func NewInCluster(cfg Config) (*Discovery, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.FailedPrecondition, err, "kubediscovery: not in a Kubernetes pod")
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubediscovery: client: %w", err)
	}
	return New(client, cfg)
}

// Start runs the informers until ctx ends and waits until their first list
// is in (or ctx ends: then it returns ctx's error, e.g. when RBAC refuses
// the list and the informers keep retrying).
func (d *Discovery) Start(ctx context.Context) error {
	d.mu.Lock()
	if d.started {
		d.mu.Unlock()
		return errdefs.FailedPreconditionf("kubediscovery: started twice")
	}
	d.started = true
	d.mu.Unlock()
	for _, start := range d.startFns {
		start(ctx.Done())
	}
	go func() {
		<-ctx.Done()
		for _, stop := range d.shutdownFns {
			stop()
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), d.synced...) {
		return errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "kubediscovery: no list of pods and endpointslices in %s", d.cfg.Namespace)
	}
	return nil
}

// Changed returns a channel closed at the next change of the slices or pods
// seen (the list may or may not differ): a caller that holds it before
// calling Nodes misses no change.
func (d *Discovery) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

func (d *Discovery) notify() {
	d.mu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

// Nodes lists the node daemons, sorted by name. It fails with unavailable
// until Start's first list is in.
func (d *Discovery) Nodes(ctx context.Context) ([]Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, s := range d.synced {
		if !s() {
			return nil, errdefs.Unavailablef("kubediscovery: not synced with the Kubernetes API yet")
		}
	}
	slices, err := d.slices.EndpointSlices(d.cfg.Namespace).List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("kubediscovery: list endpointslices: %w", err)
	}
	byName := map[string]Node{}
	for _, s := range slices {
		if s.Labels[discoveryv1.LabelServiceName] != d.cfg.Service {
			continue
		}
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port := int32(0)
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == d.cfg.PortName && p.Port != nil {
				port = *p.Port
			}
		}
		if port <= 0 || port > 65535 {
			continue // the slice does not publish the API port (yet)
		}
		for _, ep := range s.Endpoints {
			n, ok := d.node(s, ep, port)
			if !ok {
				continue
			}
			if old, dup := byName[n.Name]; dup && !better(n, old) {
				continue
			}
			byName[n.Name] = n
		}
	}
	out := make([]Node, 0, len(byName))
	for _, n := range byName {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// better says whether n should replace old for the same node: while a
// daemon's pod is replaced both are published for a moment, and the one to
// route to is the ready one, then the one not going away.
func better(n, old Node) bool {
	if n.Ready != old.Ready {
		return n.Ready
	}
	if n.Draining != old.Draining {
		return !n.Draining
	}
	return n.Pod > old.Pod // deterministic
}

func (d *Discovery) node(s *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, port int32) (Node, bool) {
	if len(ep.Addresses) == 0 {
		return Node{}, false
	}
	ip := net.ParseIP(ep.Addresses[0])
	if ip == nil {
		return Node{}, false
	}
	n := Node{
		URL: (&url.URL{Scheme: d.cfg.Scheme, Host: net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))}).String(),
	}
	// The API: a nil ready condition means unknown, to be taken as ready;
	// nil terminating means not terminating.
	ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
	terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
	n.Ready = ready && !terminating
	n.Draining = terminating
	if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
		n.Pod = ep.TargetRef.Name
		if pod, err := d.pods.Pods(d.cfg.Namespace).Get(ep.TargetRef.Name); err == nil {
			if pod.DeletionTimestamp != nil {
				n.Ready, n.Draining = false, true
			}
			if pod.Annotations[DrainingAnnotation] == "true" {
				n.Draining = true
			}
			n.Capacity = d.capacity(pod)
		}
	}
	switch {
	case ep.NodeName != nil && *ep.NodeName != "":
		n.Name = *ep.NodeName
	case n.Pod != "":
		n.Name = n.Pod
	default:
		n.Name = ip.String()
	}
	return n, true
}

func (d *Discovery) capacity(pod *corev1.Pod) Capacity {
	var c Capacity
	hint := func(name string) (string, bool) {
		v, ok := pod.Annotations[CapacityAnnotationPrefix+name]
		return v, ok
	}
	ignore := func(name, v string, why string) {
		// Once per pod and value: Nodes runs on every placement.
		key := pod.Name + "/" + name + "=" + v
		d.mu.Lock()
		if len(d.warned) > 1024 { // hints that keep changing: forget, log again
			clear(d.warned)
		}
		seen := d.warned[key]
		d.warned[key] = true
		d.mu.Unlock()
		if seen {
			return
		}
		d.cfg.Logger.Warn("kubediscovery: capacity hint ignored", "pod", pod.Name, "annotation", CapacityAnnotationPrefix+name, "value", v, "reason", why)
	}
	if v, ok := hint("max-sandboxes"); ok {
		if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 1<<20 {
			ignore("max-sandboxes", v, "want an integer from 0 to 1048576")
		} else {
			c.MaxSandboxes = n
		}
	}
	if v, ok := hint("memory"); ok {
		if q, err := resource.ParseQuantity(v); err != nil || q.Sign() < 0 {
			ignore("memory", v, "want a non-negative quantity such as 64Gi")
		} else if b, exact := q.AsInt64(); !exact {
			ignore("memory", v, "out of range")
		} else {
			c.MemoryBytes = b
		}
	}
	if v, ok := hint("cpus"); ok {
		if q, err := resource.ParseQuantity(v); err != nil || q.Sign() < 0 || q.Cmp(resource.MustParse("1M")) > 0 {
			ignore("cpus", v, "want a non-negative quantity such as 16 or 15500m")
		} else {
			c.MilliCPUs = q.MilliValue()
		}
	}
	if v, ok := hint("vm"); ok {
		c.VM = v == "true"
	}
	return c
}
