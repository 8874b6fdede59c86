package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
)

// What a node keeps whose id names no node: artifacts, snapshots, runs
// and autofix loops (found by asking every node), and SSH keys (written to every node, since
// the login they authorize lands on the node of whichever sandbox it is
// for). Artifact ids are not tagged with their node as sandbox ids are:
// an artifact outlives its sandbox, ids already handed out carry no tag,
// and the question costs one parallel HEAD per node on a download that is
// a transfer anyway.

// nodeAnswer is one node's answer to a call made on every node.
type nodeAnswer struct {
	node Node
	err  error
}

// onEveryNode calls fn on every discovered node in parallel, in
// discovery's order.
func (g *Gateway) onEveryNode(ctx context.Context, fn func(n Node) error) ([]nodeAnswer, error) {
	nodes, err := g.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, errdefs.Unavailablef("no nodes discovered")
	}
	out := make([]nodeAnswer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].node = n
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].err = fn(n)
		}()
	}
	wg.Wait()
	return out, nil
}

// holder is the node whose answer to fn is not not_found: the one that
// holds what (a snapshot, an artifact). None: not_found, unless a node did
// not answer (it might be that one's), then unavailable naming it.
func (g *Gateway) holder(ctx context.Context, what string, fn func(n Node) error) (Node, error) {
	res, err := g.onEveryNode(ctx, fn)
	if err != nil {
		return Node{}, err
	}
	var notFound error
	var silent []string
	for _, r := range res {
		var answer *errdefs.Error
		switch {
		case r.err == nil:
			return r.node, nil
		case errdefs.Is(r.err, errdefs.NotFound):
			notFound = r.err
		case errors.As(r.err, &answer):
			return Node{}, r.err
		default:
			silent = append(silent, fmt.Sprintf("%s (%v)", r.node.Name, r.err))
		}
	}
	if len(silent) > 0 {
		return Node{}, errdefs.Unavailablef("%s: not on the nodes that answer, and node %s does not answer", what, strings.Join(silent, ", node "))
	}
	return Node{}, notFound
}

// SnapshotNode is the node that holds snapshot id, as p sees it (another
// tenant's snapshot is not_found): a create from it starts there, the
// snapshot being that node's disk.
func (g *Gateway) SnapshotNode(ctx context.Context, p *principal.Principal, id string) (Node, error) {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/?#%\x00 ") {
		return Node{}, errdefs.Invalidf("from_snapshot: malformed snapshot id %q", id)
	}
	return g.holder(ctx, "from_snapshot "+id, func(n Node) error {
		var snap apitypes.Snapshot
		return g.call(ctx, n, http.MethodGet, "/v1/snapshots/"+id, nil, p, &snap)
	})
}

// artifact is GET /v1/artifacts/{id}: forwarded to the node that holds
// the artifact (a HEAD to every node finds it; the node checks the
// caller's tenant on both).
func (g *Gateway) artifact(w http.ResponseWriter, r *http.Request, p principal.Principal, id string) {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\x00 ") {
		writeError(w, errdefs.Invalidf("artifact_id: malformed %q", id))
		return
	}
	n, err := g.holder(r.Context(), "artifact_id "+id, func(n Node) error { return g.head(r.Context(), n, "/v1/artifacts/"+url.PathEscape(id), &p) })
	if errdefs.Is(err, errdefs.NotFound) {
		err = errdefs.NotFoundf("artifact_id: no artifact %q", id)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	g.forward(w, r, n, &p, "")
}

// untaggedRoute is, for a REST request about a snapshot, a run or an
// autofix loop (ids without a node tag), the path that says whether a
// node holds it; ok false for any other request.
func untaggedRoute(method, path string) (probe string, ok bool) {
	for _, prefix := range []string{"/v1/snapshots/", "/v1/runs/", "/v1/autofix/"} {
		rest, found := strings.CutPrefix(path, prefix)
		if !found || rest == "" {
			continue
		}
		id, sub, _ := strings.Cut(rest, "/")
		read := method == http.MethodGet || method == http.MethodHead
		switch {
		case prefix == "/v1/snapshots/" && sub == "" && (read || method == http.MethodDelete),
			prefix == "/v1/runs/" && sub == "" && read && id != "export",
			prefix == "/v1/runs/" && sub == "replay" && method == http.MethodPost,
			prefix == "/v1/autofix/" && (sub == "" && read || sub == "submit" && method == http.MethodPost):
			return prefix + url.PathEscape(id), true
		}
	}
	return "", false
}

// untagged forwards a request about an id without a node tag (a
// snapshot, run or autofix loop: untaggedRoute) to the node that holds
// it, found by a HEAD of probe on every node as the caller. None holds
// it: one node that answers answers it (its own not_found, word for word).
func (g *Gateway) untagged(w http.ResponseWriter, r *http.Request, p principal.Principal, probe string) {
	n, err := g.holder(r.Context(), r.URL.Path, func(n Node) error { return g.head(r.Context(), n, probe, &p) })
	switch {
	case errdefs.Is(err, errdefs.NotFound):
		g.any(w, r, p)
	case err != nil:
		writeError(w, err)
	default:
		g.forward(w, r, n, &p, "")
	}
}

// head asks node n whether path exists for p: nil for 2xx, not_found for
// 404 (a HEAD answer has no body to name the code), the node's silence
// otherwise.
func (g *Gateway) head(ctx context.Context, n Node, path string, p *principal.Principal) error {
	ctx, cancel := context.WithTimeout(ctx, g.opt.NodeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, strings.TrimSuffix(n.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	g.authorize(req.Header, p)
	res, err := g.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	switch {
	case res.StatusCode >= 200 && res.StatusCode < 300:
		return nil
	case res.StatusCode == http.StatusNotFound:
		return errdefs.NotFoundf("%s: not on node %s", path, n.Name)
	case res.StatusCode >= 400 && res.StatusCode < 500:
		return errdefs.New(errdefs.Internal, "HEAD %s: node %s answers %s", path, n.Name, res.Status)
	}
	return fmt.Errorf("HEAD %s: %s", path, res.Status)
}

// sshKeys serves /v1/ssh/keys and /v1/ssh/keys/{key} (rest) on a gateway.
// An SSH login is checked by the node of the sandbox it is for, against
// that node's keys: a key registered through a gateway is written to every
// node, a list merges theirs (one entry per fingerprint), and a removal
// removes the key, by its fingerprint, from every node that has it.
func (g *Gateway) sshKeys(w http.ResponseWriter, r *http.Request, p principal.Principal, rest string) {
	switch {
	case rest == "" && r.Method == http.MethodGet:
		l, err := g.SSHKeys(r.Context(), p)
		reply(w, http.StatusOK, l, err)
	case rest == "" && r.Method == http.MethodPost:
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			writeError(w, errdefs.LimitExceededf("body: larger than %d bytes", 64<<10))
			return
		}
		k, err := g.broadcastWrite(r.Context(), "ssh key", false, func(n Node, out any) error {
			return g.call(r.Context(), n, http.MethodPost, "/v1/ssh/keys", body, &p, out)
		})
		reply(w, http.StatusCreated, k, err)
	case rest != "" && !strings.Contains(rest, "/") && r.Method == http.MethodDelete:
		key, err := url.PathUnescape(rest)
		if err != nil || key == "" {
			writeError(w, errdefs.Invalidf("key: malformed %q", rest))
			return
		}
		if err := g.removeSSHKey(r.Context(), p, key); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, errdefs.NotFoundf("%s %s: no such ssh keys route", r.Method, r.URL.Path))
	}
}

// nodeKeys is every answering node's keys as p sees them.
func (g *Gateway) nodeKeys(ctx context.Context, p principal.Principal) ([][]apitypes.SSHKey, error) {
	var mu sync.Mutex
	lists := map[string][]apitypes.SSHKey{}
	res, err := g.onEveryNode(ctx, func(n Node) error {
		var l apitypes.SSHKeyList
		if err := g.call(ctx, n, http.MethodGet, "/v1/ssh/keys", nil, &p, &l); err != nil {
			return err
		}
		mu.Lock()
		lists[n.Name] = l.Keys
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out [][]apitypes.SSHKey
	answeredAny := false
	for _, r := range res {
		var answer *errdefs.Error
		if errors.As(r.err, &answer) {
			return nil, r.err
		}
		if r.err != nil {
			g.log.Warn("node does not answer an ssh key list", "node", r.node.Name, "err", r.err)
			continue
		}
		answeredAny = true
		out = append(out, lists[r.node.Name])
	}
	if !answeredAny {
		return nil, errdefs.Unavailablef("ssh keys: no node answers")
	}
	return out, nil
}

// SSHKeys merges the nodes' SSH keys as p sees them: one entry per owner
// and fingerprint (the first answering node's, in discovery's order).
func (g *Gateway) SSHKeys(ctx context.Context, p principal.Principal) (*apitypes.SSHKeyList, error) {
	lists, err := g.nodeKeys(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &apitypes.SSHKeyList{Keys: []apitypes.SSHKey{}}
	seen := map[string]bool{}
	for _, l := range lists {
		for _, k := range l {
			if id := k.Tenant + "\x00" + k.Fingerprint; !seen[id] {
				seen[id] = true
				out.Keys = append(out.Keys, k)
			}
		}
	}
	sort.SliceStable(out.Keys, func(i, j int) bool { return out.Keys[i].CreatedAt.Before(out.Keys[j].CreatedAt) })
	return out, nil
}

// removeSSHKey removes key (an id any node answered, or a fingerprint)
// from every node that has it: the nodes gave the key ids of their own,
// so it is removed by its fingerprint.
func (g *Gateway) removeSSHKey(ctx context.Context, p principal.Principal, key string) error {
	lists, err := g.nodeKeys(ctx, p)
	if err != nil {
		return err
	}
	fp := ""
	for _, l := range lists {
		for _, k := range l {
			if k.ID == key || k.Fingerprint == key {
				fp = k.Fingerprint
			}
		}
	}
	if fp == "" {
		return errdefs.NotFoundf("id: no ssh key %q", key)
	}
	_, err = g.broadcastWrite(ctx, "ssh key "+fp, true, func(n Node, _ any) error {
		return g.call(ctx, n, http.MethodDelete, "/v1/ssh/keys/"+url.PathEscape(fp), nil, &p, nil)
	})
	return err
}

// broadcastWrite makes a write on every node and answers the first
// node's decoded answer. With allowNotFound, a node answering not_found
// is counted as done (a removal from a node that never had it); any other
// failure is the caller's, naming the nodes done and not.
func (g *Gateway) broadcastWrite(ctx context.Context, what string, allowNotFound bool, fn func(n Node, out any) error) (json.RawMessage, error) {
	var mu sync.Mutex
	answers := map[string]json.RawMessage{}
	res, err := g.onEveryNode(ctx, func(n Node) error {
		var out json.RawMessage
		if err := fn(n, &out); err != nil {
			return err
		}
		mu.Lock()
		answers[n.Name] = out
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	var done, failed []string
	var first error
	var v json.RawMessage
	for _, r := range res {
		switch {
		case r.err == nil:
			if v == nil {
				v = answers[r.node.Name]
			}
			done = append(done, r.node.Name)
		case allowNotFound && errdefs.Is(r.err, errdefs.NotFound):
			done = append(done, r.node.Name)
		default:
			failed = append(failed, r.node.Name)
			if first == nil {
				first = r.err
				var answer *errdefs.Error
				if !errors.As(r.err, &answer) {
					first = errdefs.Unavailablef("%s: node %s does not answer: %v", what, r.node.Name, r.err)
				}
			}
		}
	}
	if first == nil {
		return v, nil
	}
	if len(done) == 0 {
		return nil, first
	}
	return nil, errdefs.Wrap(errdefs.CodeOf(first), first, "%s: done on node %s, not on node %s: %s",
		what, strings.Join(done, ", "), strings.Join(failed, ", "), errdefs.MessageOf(first))
}

// isUntagged says whether r is about an id without a node tag
// (untaggedRoute).
func isUntagged(r *http.Request) bool {
	_, ok := untaggedRoute(r.Method, r.URL.Path)
	return ok
}

// mergedList answers GET /v1/runs and GET /v1/snapshots (the ids they
// list carry no node tag) from every node, as the caller, newest first,
// as the MCP engine's run_list and snapshot_list merge them; snapshots
// of one sandbox come from its node. ok false: not such a request.
func (g *Gateway) mergedList(w http.ResponseWriter, r *http.Request, p principal.Principal) (ok bool) {
	if r.Method != http.MethodGet || (r.URL.Path != "/v1/runs" && r.URL.Path != "/v1/snapshots") {
		return false
	}
	if id := r.URL.Query().Get("sandbox_id"); id != "" && r.URL.Path == "/v1/snapshots" {
		g.route(w, r, p, id)
		return true
	}
	nodes, err := g.opt.Discovery.Nodes(r.Context())
	if err != nil {
		writeError(w, errdefs.Unavailablef("node discovery: %v", err))
		return true
	}
	type answer struct {
		runs apitypes.RunList
		snap struct {
			Snapshots []apitypes.Snapshot `json:"snapshots"`
		}
		err error
	}
	path := r.URL.Path
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out any = &answers[i].runs
			if r.URL.Path == "/v1/snapshots" {
				out = &answers[i].snap
			}
			answers[i].err = g.call(r.Context(), n, http.MethodGet, path, nil, &p, out)
		}()
	}
	wg.Wait()
	runs := apitypes.RunList{Runs: []apitypes.RunMetadata{}}
	snaps := []apitypes.Snapshot{}
	longest := 0
	for _, a := range answers {
		var e *errdefs.Error
		if errors.As(a.err, &e) {
			// The request's fault in a node's own words (a bad filter):
			// every node would say the same.
			writeError(w, a.err)
			return true
		}
		if a.err != nil {
			continue // a node that does not answer: its records are not listed
		}
		runs.Runs = append(runs.Runs, a.runs.Runs...)
		runs.Truncated = runs.Truncated || a.runs.Truncated
		longest = max(longest, len(a.runs.Runs))
		snaps = append(snaps, a.snap.Snapshots...)
	}
	if r.URL.Path == "/v1/snapshots" {
		sort.SliceStable(snaps, func(i, j int) bool { return snaps[i].CreatedAt.After(snaps[j].CreatedAt) })
		writeJSON(w, http.StatusOK, map[string]any{"snapshots": snaps})
		return true
	}
	sort.SliceStable(runs.Runs, func(i, j int) bool { return runs.Runs[i].StartTime.After(runs.Runs[j].StartTime) })
	// The page a node would give: the limit asked for, else the longest
	// single node's page (each node applied its default).
	limit := longest
	if l, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && l > 0 {
		limit = l
	}
	if len(runs.Runs) > limit {
		runs.Runs, runs.Truncated = runs.Runs[:limit], true
	}
	writeJSON(w, http.StatusOK, runs)
	return true
}
