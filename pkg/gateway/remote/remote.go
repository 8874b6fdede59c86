// Package remote is the engine of the gateway's MCP front end: an
// implementation of pkg/mcpserver's narrow Engine interface whose every
// method is a call to the nodes' REST API (pkg/api/client), so that the
// gateway runs the real MCP server (tools, sessions, tasks, progress) in
// front of a fleet. A method about a sandbox goes to the node its id's tag
// names (gateway.NodeOf); a create, and a run or agent session without a
// sandbox, is placed as the gateway's REST create is (gateway.Place);
// lists merge every node's. Each call carries the MCP caller's principal
// (gateway.NodeTransport), and validation and error mapping stay on the
// node: its error body comes back as an *errdefs.Error with its code and
// message, which the MCP server shows as it shows its own engine's.
//
// Node-wide things are decided per method (docs/SPEC.md "Through a
// gateway"): template writes and image builds go to every node; their lists
// and reads, runs, snapshots and autofix loops are merged or looked up
// across nodes; key usage is the fleet's count (gateway.KeyUsage); named
// volumes and Dockerfile builds answer unavailable, saying why.
package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/api/client"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/gateway"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/mcpserver"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/pipeline"
)

// Engine is mcpserver.Engine over a gateway's nodes.
type Engine struct {
	g   *gateway.Gateway
	cfg *config.Config

	mu      sync.Mutex
	clients map[string]*client.Client // by node URL
	names   map[*client.Client]string // node names, for build logs
}

var _ mcpserver.Engine = (*Engine)(nil)

// New returns the engine over g's nodes; cfg is the gateway's
// configuration, whose server section (tool groups, result budget, session
// end) and sandbox limits the MCP server reads (the nodes of a fleet share
// theirs).
func New(g *gateway.Gateway, cfg *config.Config) *Engine {
	return &Engine{g: g, cfg: cfg, clients: map[string]*client.Client{}, names: map[*client.Client]string{}}
}

// Config is the gateway's configuration.
func (e *Engine) Config() *config.Config { return e.cfg }

// client is node n's REST client, one per node URL, over the gateway's
// credentials-adding transport.
func (e *Engine) client(n gateway.Node) (*client.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.clients[n.URL]; ok {
		return c, nil
	}
	c, err := client.New(client.Options{URL: n.URL, Transport: e.g.NodeTransport()})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "node %s: url %q", n.Name, n.URL)
	}
	e.clients[n.URL] = c
	e.names[c] = n.Name
	return c, nil
}

// nodeErr is err of a call to node n about what: the node's own answer
// (an *errdefs.Error decoded from its error body) as it is, anything else
// — no answer, a broken stream — unavailable, naming what and the node.
func nodeErr(n gateway.Node, what string, err error) error {
	if err == nil {
		return nil
	}
	var e *errdefs.Error
	if errors.As(err, &e) {
		return err
	}
	return errdefs.Unavailablef("%s: node %s does not answer: %v", what, n.Name, err)
}

// answered says whether err is a node's own answer rather than its
// silence.
func answered(err error) bool {
	var e *errdefs.Error
	return errors.As(err, &e)
}

// onSandbox calls fn with the client of the node that holds sandbox id.
func onSandbox[T any](e *Engine, ctx context.Context, id string, fn func(c *client.Client) (T, error)) (T, error) {
	var zero T
	n, err := e.g.NodeOf(ctx, id)
	if err != nil {
		return zero, err
	}
	c, err := e.client(n)
	if err != nil {
		return zero, err
	}
	v, err := fn(c)
	if err != nil {
		return zero, nodeErr(n, "sandbox "+id, err)
	}
	return v, nil
}

// placed places a create whose placement hints are the JSON hints (the
// request itself, as the REST create reads its body) and calls fn on the
// chosen node's client. A node that does not answer or answers
// unavailable (a drain this gateway had not seen) is tried no more while
// another fits, as the REST create is placed again.
func placed[T any](e *Engine, ctx context.Context, hints any, what string, fn func(c *client.Client) (T, error)) (T, error) {
	var zero T
	body, err := json.Marshal(hints)
	if err != nil {
		return zero, errdefs.Wrap(errdefs.Internal, err, "%s: encode", what)
	}
	// Counted against the caller's fleet quota before it is placed, as
	// the REST create is; a sandbox made is bound, anything else (a
	// failure, a run whose sandbox ended with it) released.
	adm, err := e.g.Admit(ctx, body)
	if err != nil {
		return zero, err
	}
	defer adm.Release()
	tried := map[string]bool{}
	for {
		n, more, err := e.g.Place(ctx, body, tried)
		if err != nil {
			return zero, err
		}
		tried[n.Name] = true
		c, err := e.client(n)
		if err != nil {
			return zero, err
		}
		v, err := fn(c)
		if err == nil {
			if sb, ok := any(v).(*apitypes.Sandbox); ok && sb != nil {
				adm.Bind(sb.ID, n.Name)
			}
			return v, nil
		}
		// Only a refusal that did nothing is placed again: a dial that
		// failed, or the node's own unavailable (draining).
		if more && ctx.Err() == nil && (errors.Is(err, client.ErrUnreachable) || errdefs.Is(err, errdefs.Unavailable)) {
			e.g.Invalidate()
			continue
		}
		return zero, nodeErr(n, what, err)
	}
}

// nodeResult is one node's answer to a call made on every node.
type nodeResult[T any] struct {
	node gateway.Node
	v    T
	err  error
}

// concatAnswers joins the lists every node answered; a node that does not
// answer is left out, and a node's refusal of the request is the answer.
func concatAnswers[T any](res []nodeResult[[]T]) ([]T, error) {
	out := []T{}
	for _, r := range res {
		if r.err != nil {
			if answered(r.err) {
				return nil, r.err
			}
			continue
		}
		out = append(out, r.v...)
	}
	return out, nil
}

// everyNode calls fn on every node in parallel, in discovery's order.
func everyNode[T any](e *Engine, ctx context.Context, fn func(c *client.Client) (T, error)) ([]nodeResult[T], error) {
	nodes, err := e.g.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, errdefs.Unavailablef("no nodes discovered")
	}
	out := make([]nodeResult[T], len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].node = n
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := e.client(n)
			if err == nil {
				out[i].v, err = fn(c)
			}
			out[i].err = err
		}()
	}
	wg.Wait()
	return out, nil
}

// found is the answer of the one node that knows what (a run, snapshot or
// autofix id, which carry no node tag): the first answer that is not
// not_found. When none knows it, not_found, unless a node did not answer
// (it might be that one's): then unavailable, naming it.
func found[T any](e *Engine, ctx context.Context, what string, fn func(c *client.Client) (T, error)) (T, error) {
	r, err := locate(e, ctx, what, fn)
	return r.v, err
}

// locate is found with the node that answered.
func locate[T any](e *Engine, ctx context.Context, what string, fn func(c *client.Client) (T, error)) (nodeResult[T], error) {
	var zero nodeResult[T]
	res, err := everyNode(e, ctx, fn)
	if err != nil {
		return zero, err
	}
	var notFound error
	var silent []string
	for _, r := range res {
		switch {
		case r.err == nil:
			return r, nil
		case errdefs.Is(r.err, errdefs.NotFound):
			notFound = r.err
		case answered(r.err):
			return zero, r.err
		default:
			silent = append(silent, fmt.Sprintf("%s (%v)", r.node.Name, r.err))
		}
	}
	if len(silent) > 0 {
		return zero, errdefs.Unavailablef("%s: not on the nodes that answer, and node %s does not answer", what, strings.Join(silent, ", node "))
	}
	return zero, notFound
}

// broadcast makes a write on every node (templates, images: a fleet's
// nodes share them) and returns the first node's answer. Nodes answering
// not_found are counted as done when another did it (allowNotFound: a
// delete); any other failure is the caller's, naming the nodes where the
// write was done and those where it was not.
func broadcast[T any](e *Engine, ctx context.Context, what string, allowNotFound bool, fn func(c *client.Client) (T, error)) (T, error) {
	var zero T
	res, err := everyNode(e, ctx, fn)
	if err != nil {
		return zero, err
	}
	var done, failed []string
	var first error
	var v T
	got, notFound := false, 0
	for _, r := range res {
		switch {
		case r.err == nil:
			if !got {
				v, got = r.v, true
			}
			done = append(done, r.node.Name)
		case allowNotFound && errdefs.Is(r.err, errdefs.NotFound):
			notFound++
			if first == nil && notFound == len(res) {
				first = r.err
			}
		default:
			failed = append(failed, r.node.Name)
			if first == nil {
				first = nodeErr(r.node, what, r.err)
			}
		}
	}
	if len(failed) == 0 && got {
		return v, nil
	}
	if first == nil {
		return zero, errdefs.NotFoundf("%s: on no node", what)
	}
	if len(done) == 0 {
		return zero, first
	}
	return zero, errdefs.Wrap(errdefs.CodeOf(first), first, "%s: done on node %s, not on node %s: %s",
		what, strings.Join(done, ", "), strings.Join(failed, ", "), errdefs.MessageOf(first))
}

// anyNode is the answer of the first node (in discovery's order) that
// answers: for things every node of a fleet has alike (languages).
func anyNode[T any](e *Engine, ctx context.Context, what string, fn func(c *client.Client) (T, error)) (T, error) {
	var zero T
	nodes, err := e.g.Nodes(ctx)
	if err != nil {
		return zero, err
	}
	var silent []string
	for _, n := range nodes {
		c, err := e.client(n)
		if err != nil {
			return zero, err
		}
		v, err := fn(c)
		if err == nil || answered(err) {
			return v, err
		}
		silent = append(silent, fmt.Sprintf("%s (%v)", n.Name, err))
	}
	return zero, errdefs.Unavailablef("%s: no node answers: %s", what, strings.Join(silent, "; "))
}

// unavailable is the answer of a method the gateway does not serve.
func unavailable(method, why string) error {
	return errdefs.Unavailablef("%s: not served through the gateway: %s", method, why)
}

// Sandboxes.

// CreateSandbox places the sandbox and creates it there. One started from
// a snapshot goes to the node that holds the snapshot.
func (e *Engine) CreateSandbox(ctx context.Context, req apitypes.CreateSandboxRequest) (*apitypes.Sandbox, error) {
	return e.CreateSandboxProgress(ctx, req, nil)
}

// CreateSandboxProgress is CreateSandbox with the node's progress lines.
func (e *Engine) CreateSandboxProgress(ctx context.Context, req apitypes.CreateSandboxRequest, progress func(string)) (*apitypes.Sandbox, error) {
	create := func(c *client.Client) (*apitypes.Sandbox, error) {
		if progress == nil {
			return c.CreateSandbox(ctx, req)
		}
		return c.CreateSandboxProgress(ctx, req, progress)
	}
	if req.FromSnapshot != "" {
		// A snapshot is a node's disk: the fork starts beside it, found
		// as the REST create finds it (gateway.SnapshotNode), and counted
		// against the caller's fleet quota as a placed create is.
		var p *principal.Principal
		if pr, ok := principal.From(ctx); ok {
			p = &pr
		}
		n, err := e.g.SnapshotNode(ctx, p, req.FromSnapshot)
		if err != nil {
			return nil, err
		}
		body, err := json.Marshal(req)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "sandbox_create: encode")
		}
		adm, err := e.g.Admit(ctx, body)
		if err != nil {
			return nil, err
		}
		defer adm.Release()
		c, err := e.client(n)
		if err != nil {
			return nil, err
		}
		sb, err := create(c)
		if err != nil {
			return nil, nodeErr(n, "sandbox_create", err)
		}
		adm.Bind(sb.ID, n.Name)
		return sb, nil
	}
	return placed(e, ctx, req, "sandbox_create", create)
}

// ListSandboxes merges every node's list (gateway.ListSandboxes): the
// sandboxes of a node that does not answer are listed unavailable.
func (e *Engine) ListSandboxes(ctx context.Context, state string) ([]*apitypes.Sandbox, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, errdefs.New(errdefs.Internal, "sandbox_list: the call names no caller")
	}
	l, err := e.g.ListSandboxes(ctx, p, gateway.StateQuery(state))
	if err != nil {
		return nil, err
	}
	out := make([]*apitypes.Sandbox, len(l.Sandboxes))
	for i := range l.Sandboxes {
		out[i] = &l.Sandboxes[i]
	}
	return out, nil
}

// GetSandbox asks the sandbox's node.
func (e *Engine) GetSandbox(ctx context.Context, id string) (*apitypes.SandboxDetail, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.SandboxDetail, error) { return c.GetSandbox(ctx, id) })
}

// TerminateSandbox asks the sandbox's node.
func (e *Engine) TerminateSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	sb, err := onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.Sandbox, error) { return c.TerminateSandbox(ctx, id) })
	if err == nil {
		e.g.Released(id) // its fleet quota count, as a REST terminate's
	}
	return sb, err
}

// TerminateLabeled terminates, on every node and as the gateway, the live
// sandboxes labelled key=value (those an ended MCP session created: its
// id is the gateway's, unique across the fleet).
func (e *Engine) TerminateLabeled(ctx context.Context, key, value, reason string) ([]string, error) {
	ctx = gateway.AsGateway(ctx)
	res, err := everyNode(e, ctx, func(c *client.Client) ([]string, error) {
		l, err := c.ListSandboxes(ctx, "")
		if err != nil {
			return nil, err
		}
		var done []string
		var errs []error
		for _, sb := range l {
			if sb.Labels[key] != value {
				continue
			}
			if _, err := c.TerminateSandbox(ctx, sb.ID); err != nil && !errdefs.Is(err, errdefs.NotFound) {
				errs = append(errs, fmt.Errorf("terminate %s: %w", sb.ID, err))
				continue
			}
			done = append(done, sb.ID)
		}
		return done, errors.Join(errs...)
	})
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, r := range res {
		done = append(done, r.v...)
		if r.err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", r.node.Name, r.err))
		}
	}
	return done, errors.Join(errs...)
}

// PauseSandbox asks the sandbox's node.
func (e *Engine) PauseSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.Sandbox, error) { return c.PauseSandbox(ctx, id) })
}

// ResumeSandbox asks the sandbox's node.
func (e *Engine) ResumeSandbox(ctx context.Context, id string) (*apitypes.Sandbox, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.Sandbox, error) { return c.ResumeSandbox(ctx, id) })
}

// SandboxNetwork asks the sandbox's node.
func (e *Engine) SandboxNetwork(ctx context.Context, req apitypes.SandboxNetworkRequest) (*apitypes.NetworkStatus, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.NetworkStatus, error) { return c.SandboxNetwork(ctx, req) })
}

// WatchNetwork is not carried through a gateway: the DNS forwarder that
// would hold a refused lookup runs on the node, and a question to the
// MCP client cannot cross the node's REST API. The MCP server then
// reports the call's refusals after it ends (network_refusals), as for
// a client without elicitation.
func (e *Engine) WatchNetwork(ctx context.Context, id string, w engine.NetworkWatch) (func(), error) {
	return nil, unavailable("network approvals during a call", "the DNS forwarder that would hold the lookup is on sandbox "+id+"'s node")
}

// ExposePort asks the sandbox's node; the URLs name the gateway's preview
// listener, as the REST answer's do (gateway.PointExposure).
func (e *Engine) ExposePort(ctx context.Context, req apitypes.ExposePortRequest) (*apitypes.PortExposure, error) {
	pe, err := onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.PortExposure, error) {
		return c.ExposePort(ctx, req.SandboxID, req.Port)
	})
	if err != nil {
		return nil, err
	}
	if err := e.g.PointExposure(pe); err != nil {
		return nil, err
	}
	return pe, nil
}

// Commands and jobs.

// Exec runs the command on the sandbox's node through its exec stream:
// onOutput sees the output as the node sends it.
func (e *Engine) Exec(ctx context.Context, req apitypes.ExecRequest, onOutput sandbox.OutputFunc) (*apitypes.ExecResult, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.ExecResult, error) {
		return c.Exec(ctx, req.SandboxID, req, client.OutputFunc(onOutput))
	})
}

// StartJob asks the sandbox's node.
func (e *Engine) StartJob(ctx context.Context, req apitypes.ExecRequest) (string, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (string, error) { return c.StartJob(ctx, req.SandboxID, req) })
}

// JobStatus asks the sandbox's node.
func (e *Engine) JobStatus(ctx context.Context, req apitypes.JobStatusRequest) (*apitypes.JobStatus, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.JobStatus, error) {
		return c.JobStatus(ctx, req.SandboxID, req.JobID, req.StdoutOffset, req.StderrOffset, req.MaxBytes)
	})
}

// KillJob asks the sandbox's node.
func (e *Engine) KillJob(ctx context.Context, req apitypes.JobKillRequest) (*apitypes.JobKillResult, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.JobKillResult, error) {
		return c.KillJob(ctx, req.SandboxID, req.JobID, req.Signal)
	})
}

// RunTask asks the sandbox's node.
func (e *Engine) RunTask(ctx context.Context, req apitypes.RunTaskRequest) (*apitypes.ExecResult, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.ExecResult, error) { return c.RunTask(ctx, req) })
}

// PackagesInstall asks the sandbox's node.
func (e *Engine) PackagesInstall(ctx context.Context, req apitypes.PackagesInstallRequest) (*apitypes.ExecResult, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.ExecResult, error) { return c.PackagesInstall(ctx, req) })
}

// Files.

// WriteFile uploads the content to the sandbox's node, decoded as the
// daemon's engine decodes it (apitypes.DecodeFileContent).
func (e *Engine) WriteFile(ctx context.Context, req apitypes.FileWriteRequest) (*apitypes.FileResult, error) {
	data, err := apitypes.DecodeFileContent(req.Encoding, req.Content)
	if err != nil {
		return nil, err
	}
	// The mode goes as the text it is: the node parses it, and refuses
	// it in its own words.
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.FileResult, error) {
		return c.WriteFileMode(ctx, req.SandboxID, req.Path, req.Mode, req.Append, int64(len(data)), bytes.NewReader(data))
	})
}

// ReadFile downloads from the sandbox's node and shapes the answer as the
// daemon's engine does (apitypes.NewFileReadResult).
func (e *Engine) ReadFile(ctx context.Context, req apitypes.FileReadRequest) (*apitypes.FileReadResult, error) {
	if err := apitypes.CheckReadEncoding(req.Encoding); err != nil {
		return nil, err
	}
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.FileReadResult, error) {
		max := req.MaxBytes
		if max == 0 {
			// A tool's read, not a download's: the node's REST route
			// reads 0 as the largest transfer.
			max = engine.DefaultReadBytes
		}
		var buf bytes.Buffer
		fd, err := c.ReadFile(ctx, req.SandboxID, req.Path, req.Offset, max, &buf)
		if err != nil {
			return nil, err
		}
		return apitypes.NewFileReadResult(req, req.Path, fd.Size, fd.Truncated, buf.Bytes()), nil
	})
}

// ListFilesPage asks the sandbox's node.
func (e *Engine) ListFilesPage(ctx context.Context, req apitypes.FileListRequest) (*apitypes.FileList, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.FileList, error) { return c.ListFilesPage(ctx, req) })
}

// DeleteFile asks the sandbox's node.
func (e *Engine) DeleteFile(ctx context.Context, id, p string, recursive bool) (*apitypes.FileResult, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.FileResult, error) { return c.DeleteFile(ctx, id, p, recursive) })
}

// ExportFiles asks the sandbox's node.
func (e *Engine) ExportFiles(ctx context.Context, id, dir string) (*apitypes.Artifact, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) (*apitypes.Artifact, error) { return c.ExportFiles(ctx, id, dir) })
}

// Templates: every node holds the fleet's templates, so that a create
// naming one may be placed anywhere.

// CreateTemplate creates the template on every node.
func (e *Engine) CreateTemplate(ctx context.Context, req apitypes.TemplateCreateRequest) (*apitypes.Template, error) {
	return broadcast(e, ctx, "template "+req.Name, false, func(c *client.Client) (*apitypes.Template, error) { return c.CreateTemplate(ctx, req) })
}

// ListTemplates merges the nodes' lists by name (the first node's entry
// of a name wins).
func (e *Engine) ListTemplates(ctx context.Context) (*apitypes.TemplateList, error) {
	res, err := everyNode(e, ctx, func(c *client.Client) ([]apitypes.Template, error) { return c.Templates(ctx) })
	if err != nil {
		return nil, err
	}
	out := &apitypes.TemplateList{Templates: []apitypes.Template{}}
	seen := map[string]bool{}
	for _, r := range res {
		if r.err != nil {
			if answered(r.err) {
				return nil, r.err
			}
			continue // a node that does not answer: the others hold the same
		}
		for _, t := range r.v {
			if !seen[t.Name] {
				seen[t.Name] = true
				out.Templates = append(out.Templates, t)
			}
		}
	}
	sort.Slice(out.Templates, func(i, j int) bool { return out.Templates[i].Name < out.Templates[j].Name })
	return out, nil
}

// GetTemplate is the first node's that has it.
func (e *Engine) GetTemplate(ctx context.Context, name string) (*apitypes.Template, error) {
	return found(e, ctx, "template "+name, func(c *client.Client) (*apitypes.Template, error) { return c.GetTemplate(ctx, name) })
}

// DeleteTemplate deletes the template on every node that has it.
func (e *Engine) DeleteTemplate(ctx context.Context, name string) error {
	_, err := broadcast(e, ctx, "template "+name, true, func(c *client.Client) (struct{}, error) { return struct{}{}, c.DeleteTemplate(ctx, name) })
	return err
}

// Named volumes are a node's disk: not served until the fleet has volumes
// every node can mount.

const volumesWhy = "a named volume is one node's disk and the gateway cannot yet place a sandbox beside its volumes; use the node's API"

// CreateVolume is not served (volumesWhy).
func (e *Engine) CreateVolume(ctx context.Context, req apitypes.VolumeCreateRequest) (*apitypes.Volume, error) {
	return nil, unavailable("volume_create", volumesWhy)
}

// ListVolumes is not served (volumesWhy).
func (e *Engine) ListVolumes(ctx context.Context) (*apitypes.VolumeList, error) {
	return nil, unavailable("volume_list", volumesWhy)
}

// GetVolume is not served (volumesWhy).
func (e *Engine) GetVolume(ctx context.Context, name string) (*apitypes.Volume, error) {
	return nil, unavailable("volume_get", volumesWhy)
}

// DeleteVolume is not served (volumesWhy).
func (e *Engine) DeleteVolume(ctx context.Context, name string) error {
	return unavailable("volume_delete", volumesWhy)
}

// Snapshots live on the node of the sandbox they were taken of.

// SnapshotSandbox asks the sandbox's node.
func (e *Engine) SnapshotSandbox(ctx context.Context, req apitypes.SnapshotRequest) (*apitypes.Snapshot, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.Snapshot, error) {
		return c.SnapshotSandbox(ctx, req.SandboxID, req.Name)
	})
}

// RestoreSandbox asks the sandbox's node.
func (e *Engine) RestoreSandbox(ctx context.Context, req apitypes.RestoreRequest) (*apitypes.Sandbox, error) {
	return onSandbox(e, ctx, req.SandboxID, func(c *client.Client) (*apitypes.Sandbox, error) {
		return c.RestoreSandbox(ctx, req.SandboxID, req.SnapshotID)
	})
}

// ListSnapshots asks the sandbox's node, or merges every node's.
func (e *Engine) ListSnapshots(ctx context.Context, sandboxID string) ([]apitypes.Snapshot, error) {
	if sandboxID != "" {
		return onSandbox(e, ctx, sandboxID, func(c *client.Client) ([]apitypes.Snapshot, error) { return c.Snapshots(ctx, sandboxID) })
	}
	res, err := everyNode(e, ctx, func(c *client.Client) ([]apitypes.Snapshot, error) { return c.Snapshots(ctx, "") })
	if err != nil {
		return nil, err
	}
	out, err := concatAnswers(res)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// DeleteSnapshot deletes it on the node that has it.
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := found(e, ctx, "snapshot "+id, func(c *client.Client) (struct{}, error) { return struct{}{}, c.DeleteSnapshot(ctx, id) })
	return err
}

// Runs, autofix and agents.

// RunCode runs in the given sandbox on its node, else places the run's
// throw-away sandbox as a create is placed; onOutput sees the node's
// stream.
func (e *Engine) RunCode(ctx context.Context, req apitypes.RunCodeRequest, onOutput sandbox.OutputFunc) (*apitypes.RunResult, error) {
	run := func(c *client.Client) (*apitypes.RunResult, error) {
		return c.RunCodeStream(ctx, req, client.OutputFunc(onOutput))
	}
	if req.SandboxID != "" {
		return onSandbox(e, ctx, req.SandboxID, run)
	}
	return placed(e, ctx, req, "run_code", run)
}

// ListRuns merges every node's run records, newest first, up to the
// filter's limit.
func (e *Engine) ListRuns(ctx context.Context, f apitypes.RunFilter) ([]apitypes.RunMetadata, error) {
	res, err := everyNode(e, ctx, func(c *client.Client) ([]apitypes.RunMetadata, error) { return c.Runs(ctx, f) })
	if err != nil {
		return nil, err
	}
	out, err := concatAnswers(res)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartTime.After(out[j].StartTime) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// GetRun is the record of the node that has it.
func (e *Engine) GetRun(ctx context.Context, id string, maxLog int64) (*apitypes.RunRecord, error) {
	return found(e, ctx, "run "+id, func(c *client.Client) (*apitypes.RunRecord, error) { return c.Run(ctx, id, maxLog) })
}

// ReplayRun goes to the node that has the run: its image and record are
// there.
func (e *Engine) ReplayRun(ctx context.Context, req apitypes.RunReplayRequest) (*apitypes.RunReplay, error) {
	at, err := locate(e, ctx, "run "+req.RunID, func(c *client.Client) (*apitypes.RunRecord, error) { return c.Run(ctx, req.RunID, 1) })
	if err != nil {
		return nil, err
	}
	c, err := e.client(at.node)
	if err != nil {
		return nil, err
	}
	res, err := c.ReplayRun(ctx, req)
	return res, nodeErr(at.node, "run "+req.RunID, err)
}

var _ pipeline.Replays = (*Engine)(nil)

// Autofix places the loop's sandbox as a create is placed. The node fixes
// with its own provider or the client one; the sampling provider (the MCP
// client's model) cannot cross REST, so a loop asking for it falls back to
// the client provider, as the daemon does for a client that cannot sample.
func (e *Engine) Autofix(ctx context.Context, req apitypes.AutofixRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error) {
	return placed(e, ctx, req, "autofix", func(c *client.Client) (*apitypes.AutofixResult, error) {
		return c.Autofix(ctx, req, opts.OnEvent)
	})
}

// AutofixSubmit goes to the node whose loop it is.
func (e *Engine) AutofixSubmit(ctx context.Context, req apitypes.AutofixSubmitRequest, opts engine.AutofixOptions) (*apitypes.AutofixResult, error) {
	// The loop's id carries no node: the node that knows it answers.
	at, err := locate(e, ctx, "autofix_id "+req.AutofixID, func(c *client.Client) (*apitypes.AutofixResult, error) {
		return c.AutofixStatus(ctx, req.AutofixID)
	})
	if err != nil {
		return nil, err
	}
	c, err := e.client(at.node)
	if err != nil {
		return nil, err
	}
	res, err := c.AutofixSubmit(ctx, req, opts.OnEvent)
	return res, nodeErr(at.node, "autofix "+req.AutofixID, err)
}

// AutofixStatus is the status of the node that knows the loop.
func (e *Engine) AutofixStatus(ctx context.Context, id string) (*apitypes.AutofixResult, error) {
	return found(e, ctx, "autofix "+id, func(c *client.Client) (*apitypes.AutofixResult, error) { return c.AutofixStatus(ctx, id) })
}

// AgentRun runs in the given sandbox on its node, else places the
// session's sandbox; progress sees the node's stream.
func (e *Engine) AgentRun(ctx context.Context, req apitypes.AgentRunRequest, progress func(apitypes.AgentProgress)) (*apitypes.AgentRunResult, error) {
	run := func(c *client.Client) (*apitypes.AgentRunResult, error) { return c.AgentRun(ctx, req, progress) }
	if req.SandboxID != "" {
		return onSandbox(e, ctx, req.SandboxID, run)
	}
	return placed(e, ctx, req, "agent_run", run)
}

// KeyUsage is the key's quota and its use counted across the fleet, from
// the gateways' keys store and fleet database (gateway.KeyUsage, as GET
// /v1/keys/{id}/usage on the gateway answers).
func (e *Engine) KeyUsage(ctx context.Context, id string) (*apitypes.KeyUsage, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, errdefs.New(errdefs.Internal, "quota_usage: the call names no caller")
	}
	return e.g.KeyUsage(ctx, p, id)
}

// Languages and images: the nodes of a fleet share their configuration;
// images are built on each.

// Languages is the first answering node's.
func (e *Engine) Languages(ctx context.Context) ([]apitypes.LanguageInfo, error) {
	return anyNode(e, ctx, "languages", func(c *client.Client) ([]apitypes.LanguageInfo, error) { return c.Languages(ctx) })
}

// ImageList is the first answering node's.
func (e *Engine) ImageList(ctx context.Context) (*apitypes.ImageList, error) {
	return anyNode(e, ctx, "image_list", func(c *client.Client) (*apitypes.ImageList, error) { return c.ImageList(ctx) })
}

// EnsureImage builds the image on every node, each node's log lines
// prefixed with its name.
func (e *Engine) EnsureImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error) {
	lw := &nodeLog{e: e, w: log}
	return broadcast(e, ctx, "image "+name, false, func(c *client.Client) (*apitypes.Image, error) {
		return c.BuildImage(ctx, name, lw.line(c))
	})
}

// EnsureVMImage builds the VM guest image on every node.
func (e *Engine) EnsureVMImage(ctx context.Context, name string, log io.Writer) (*apitypes.Image, error) {
	lw := &nodeLog{e: e, w: log}
	return broadcast(e, ctx, "vm image "+name, false, func(c *client.Client) (*apitypes.Image, error) {
		return c.BuildVMImage(ctx, name, lw.line(c))
	})
}

// PullImage pulls the image on every node.
func (e *Engine) PullImage(ctx context.Context, ref string, progress func(apitypes.ImageProgress)) (*apitypes.Image, error) {
	var mu sync.Mutex
	return broadcast(e, ctx, "image "+ref, false, func(c *client.Client) (*apitypes.Image, error) {
		return c.PullImage(ctx, ref, func(p apitypes.ImageProgress) {
			if progress != nil {
				mu.Lock()
				defer mu.Unlock()
				progress(p)
			}
		})
	})
}

// BuildDockerfile is not served: its build context is one stream.
func (e *Engine) BuildDockerfile(ctx context.Context, req apitypes.DockerfileBuildRequest, ctxTar io.Reader, progress func(apitypes.BuildProgress)) (*apitypes.Image, error) {
	return nil, unavailable("image_build_dockerfile", "its build context is one stream and an image is built on every node; build it through each node's API")
}

// RemoveImage removes the image on every node that has it.
func (e *Engine) RemoveImage(ctx context.Context, name string) error {
	_, err := broadcast(e, ctx, "image "+name, true, func(c *client.Client) (struct{}, error) { return struct{}{}, c.RemoveImage(ctx, name) })
	return err
}

// Machines.

// ScreenshotSandbox asks the sandbox's node.
func (e *Engine) ScreenshotSandbox(ctx context.Context, id string) ([]byte, error) {
	return onSandbox(e, ctx, id, func(c *client.Client) ([]byte, error) { return c.Screenshot(ctx, id) })
}

// VMTest places its machine as a create of backend vm.
func (e *Engine) VMTest(ctx context.Context, req apitypes.VMTestRequest) (*apitypes.VMTestResult, error) {
	hints := struct {
		apitypes.VMTestRequest
		Backend string `json:"backend"`
	}{req, "vm"}
	return placed(e, ctx, hints, "vm_test", func(c *client.Client) (*apitypes.VMTestResult, error) { return c.VMTest(ctx, req) })
}

// nodeLog writes the build logs of several nodes to one writer, a line at
// a time, each prefixed with its node.
type nodeLog struct {
	e  *Engine
	mu sync.Mutex
	w  io.Writer
}

func (l *nodeLog) line(c *client.Client) func(string) {
	return func(s string) {
		if l.w == nil {
			return
		}
		l.e.mu.Lock()
		name := l.e.names[c]
		l.e.mu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		fmt.Fprintf(l.w, "[%s] %s\n", name, strings.TrimRight(s, "\n"))
	}
}
