package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// placeHints are the fields of a create (POST /v1/sandboxes, /v1/run,
// /v1/agent/run) that placement reads. The node validates the whole
// request: a body placement cannot read still goes to a node, whose answer
// names the field at fault.
type placeHints struct {
	Backend  string   `json:"backend"`
	Image    string   `json:"image"`
	Language string   `json:"language"`
	MemoryMB *int64   `json:"memory_mb"`
	CPUs     *float64 `json:"cpus"`
	DiskMB   *int64   `json:"disk_mb"`
	// SandboxID, on a run (/v1/run, /v1/agent/run), names the live
	// sandbox to run in: routed to its node, not placed.
	SandboxID string `json:"sandbox_id"`
	// FromSnapshot, on a sandbox create, names the snapshot it starts
	// from: created on the node that holds it, not placed.
	FromSnapshot string `json:"from_snapshot"`
	// e2b: an E2B create, for a node that serves the E2B API, whose
	// answer names e2bDomain.
	e2b       bool
	e2bDomain *string
}

// fits says whether node st takes a create of h, and whether it holds
// the image the create names.
func fits(pr probed, h placeHints) (ok, hasImage bool) {
	st := pr.st
	if pr.err != nil || !pr.node.Ready || pr.node.Draining || !st.Ready || st.Draining {
		return false, false
	}
	if st.MaxSandboxes > 0 && st.Live >= st.MaxSandboxes {
		return false, false
	}
	if h.MemoryMB != nil && st.MemoryBytes > 0 && st.MemoryCommittedBytes+*h.MemoryMB<<20 > st.MemoryBytes {
		return false, false
	}
	if h.CPUs != nil && st.CPUs > 0 && st.CPUsCommitted+*h.CPUs > st.CPUs*float64(cpuOvercommit) {
		return false, false
	}
	if h.Backend == "vm" && !st.VM || h.e2b && st.E2BPort == 0 {
		return false, false
	}
	img := h.Image
	if img == "" {
		img = h.Language
	}
	hasImage = img == ""
	for _, name := range st.Images {
		hasImage = hasImage || name == img
	}
	return true, hasImage
}

// cpuOvercommit: CPU limits are ceilings, not reservations (an idle
// sandbox uses none), so a node takes limits summing to this many times
// its cores; memory is not overcommitted.
const cpuOvercommit = 4

// place picks the node for a create: among the nodes that fit, those that
// hold the image first (one that does not would build it on first use),
// then the fewest live sandboxes — creating ones count, so concurrent
// creates through several gateways spread — ties broken at random.
func place(probes []probed, h placeHints) (Node, error) {
	var cands []probed
	withImage := false
	for _, pr := range probes {
		ok, img := fits(pr, h)
		switch {
		case !ok:
		case img && !withImage:
			cands, withImage = []probed{pr}, true
		case img == withImage:
			cands = append(cands, pr)
		}
	}
	if len(cands) == 0 {
		return Node{}, errdefs.Unavailablef("no node takes this sandbox (%s)", summary(probes))
	}
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].st.Live < cands[j].st.Live })
	return cands[0].node, nil
}

// create places a create and forwards it.
func (g *Gateway) create(w http.ResponseWriter, r *http.Request, p principal.Principal) {
	start := time.Now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opt.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, errdefs.LimitExceededf("body: larger than %d bytes", tooBig.Limit))
			return
		}
		writeError(w, errdefs.Invalidf("body: %v", err))
		return
	}
	var h placeHints
	_ = json.Unmarshal(body, &h) // the node refuses a malformed body, naming the field
	if h.SandboxID != "" && r.URL.Path != "/v1/sandboxes" {
		// A run in a sandbox that exists: where it lives, nothing new
		// to place or count.
		n, err := g.NodeOf(r.Context(), h.SandboxID)
		if err != nil {
			writeError(w, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		g.forward(w, r, n, &p, "")
		return
	}
	if h.FromSnapshot != "" && r.URL.Path == "/v1/sandboxes" {
		g.createFromSnapshot(w, r, p, body, h)
		return
	}
	// Counted against the key's fleet quota before it is placed; a run's
	// sandbox ends with the run, so its reservation is released then.
	rsv, err := g.reserve(r.Context(), p, h)
	if err != nil {
		writeError(w, err)
		return
	}
	defer g.settle(rsv)
	g.createOn(w, r, p, body, h, map[string]bool{}, start, rsv)
}

// createFromSnapshot creates a sandbox from a snapshot on the node that
// holds the snapshot, counted against the key's fleet quota as a placed
// create is (reserved once the snapshot is found, bound to the sandbox).
func (g *Gateway) createFromSnapshot(w http.ResponseWriter, r *http.Request, p principal.Principal, body []byte, h placeHints) {
	n, err := g.SnapshotNode(r.Context(), &p, h.FromSnapshot)
	if err != nil {
		writeError(w, err)
		return
	}
	rsv, err := g.reserve(r.Context(), p, h)
	if err != nil {
		writeError(w, err)
		return
	}
	defer g.settle(rsv)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	g.forwardTarget(w, r, n, target{p: &p, rsv: rsv, bind: true})
}

// createOn places a create on a node not in tried and forwards it; a node
// that refuses it (unavailable: draining, or gone) is tried no more, and
// the last candidate's answer is the caller's.
func (g *Gateway) createOn(w http.ResponseWriter, r *http.Request, p principal.Principal, body []byte, h placeHints, tried map[string]bool, start time.Time, rsv *reservation) {
	n, more, err := g.placeCounted(r.Context(), h, tried)
	// What the gateway spent before the node saw the create (reading the
	// body, placing), for operators and the overhead benchmark; the
	// node's own headers are added to it.
	w.Header().Set("Server-Timing", fmt.Sprintf("gateway-place;dur=%.3f", float64(time.Since(start).Microseconds())/1000))
	if err != nil {
		g.settle(rsv)
		writeError(w, err)
		return
	}
	tried[n.Name] = true
	var retry func(http.ResponseWriter)
	if more {
		retry = func(w http.ResponseWriter) {
			g.log.Info("node refused a create; placing it again", "node", n.Name)
			g.invalidate()
			g.createOn(w, r, p, body, h, tried, start, rsv)
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	t := target{p: &p, retry: retry, rsv: rsv, bind: r.URL.Path == "/v1/sandboxes"}
	if h.e2b {
		t.bind, t.e2bDomain = true, h.e2bDomain
		g.forwardE2B(w, r, n, t)
		return
	}
	g.forwardTarget(w, r, n, t)
}

// placeCounted places on the capacity view among the nodes not in
// tried, and counts the placement into the view so that the next create
// through this gateway sees it. A view older than ProbeInterval is still
// used while one background probe renews it (stale-while-revalidate):
// a create waits for the nodes' answers only when there is no view at
// all (the first create, or after a node refused one). more says whether
// another node would have fitted.
func (g *Gateway) placeCounted(ctx context.Context, h placeHints, tried map[string]bool) (n Node, more bool, err error) {
	g.viewMu.Lock()
	empty := g.view == nil
	if !empty && time.Since(g.viewAt) >= g.opt.ProbeInterval && !g.refreshing {
		g.refreshing = true
		go func() {
			// Not the request's context: the renewed view outlives it.
			v := g.probe(context.Background())
			g.viewMu.Lock()
			g.view, g.viewAt, g.refreshing = v, time.Now(), false
			g.viewMu.Unlock()
		}()
	}
	g.viewMu.Unlock()
	if empty {
		v := g.probe(ctx)
		g.viewMu.Lock()
		g.view, g.viewAt = v, time.Now()
		g.viewMu.Unlock()
	}
	g.viewMu.Lock()
	defer g.viewMu.Unlock()
	var cands []probed
	for _, pr := range g.view {
		if !tried[pr.node.Name] {
			cands = append(cands, pr)
		}
	}
	n, err = place(cands, h)
	if err != nil {
		return n, false, err
	}
	fitting := 0
	for _, pr := range cands {
		if ok, _ := fits(pr, h); ok {
			fitting++
		}
		if pr.node.Name == n.Name {
			pr.st.Live++
			if h.MemoryMB != nil {
				pr.st.MemoryCommittedBytes += *h.MemoryMB << 20
			}
			if h.CPUs != nil {
				pr.st.CPUsCommitted += *h.CPUs
			}
		}
	}
	return n, fitting > 1, nil
}

// invalidate makes the next placement probe the nodes again.
func (g *Gateway) invalidate() {
	g.viewMu.Lock()
	g.view = nil
	g.viewMu.Unlock()
}

// listNodes is GET /v1/nodes: every node and its capacity.
func (g *Gateway) listNodes(w http.ResponseWriter, r *http.Request) {
	out := apitypes.FleetNodeList{Nodes: []apitypes.FleetNode{}}
	for _, pr := range g.probe(r.Context()) {
		ni := apitypes.FleetNode{Name: pr.node.Name, URL: pr.node.URL, Reachable: pr.err == nil}
		if pr.err != nil {
			ni.Error = pr.err.Error()
		} else {
			ni.Status = pr.st
			ni.Status.Draining = ni.Status.Draining || pr.node.Draining
		}
		out.Nodes = append(out.Nodes, ni)
	}
	writeJSON(w, http.StatusOK, out)
}

// drain is PUT /v1/nodes/{name}/drain: the drain is the node's own flag,
// so every gateway sees it at its next probe.
func (g *Gateway) drain(w http.ResponseWriter, r *http.Request, name string) {
	nodes, err := g.opt.Discovery.Nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.Unavailablef("node discovery: %v", err))
		return
	}
	for _, n := range nodes {
		if n.Name == name {
			g.invalidate()
			g.forward(w, r, n, nil, "/v1/node/drain")
			return
		}
	}
	writeError(w, errdefs.NotFoundf("node: no node named %q", name))
}
