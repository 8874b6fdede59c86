package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/oci"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/volumes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// Templates: a named image with an optional start command, its readiness
// check (a port that accepts a connection, or a command that exits 0),
// default limits, network and environment, and a warm pool size. They are
// rows of SQLite (migration 13); sandbox_create {template} returns a
// sandbox whose start command is ready, taken from the template's warm
// pool (sandbox.Manager's pool, keyed "template:NAME", whose sandboxes are
// made ready by readyTemplate before they are offered) when one waits.

// Readiness bounds.
const (
	defaultReadyTimeout = 60 * time.Second
	// readyPoll is the pause between two readiness probes: a port that
	// does not answer yet, a command that failed.
	readyPoll = 20 * time.Millisecond
)

// CreateTemplate validates and stores a template, and sizes its warm pool.
func (e *Engine) CreateTemplate(ctx context.Context, req apitypes.TemplateCreateRequest) (*apitypes.Template, error) {
	if err := volumes.CheckName("name", req.Name); err != nil {
		return nil, err
	}
	if req.Image == "" {
		return nil, errdefs.Invalidf("image: required (one of %s)", strings.Join(e.knownImages(), ", "))
	}
	if err := apitypes.CheckTemplate(&req, e.cfg.Sandbox.MaxSandboxes); err != nil {
		return nil, err
	}
	// The defaults must make a valid sandbox: validated as a create is,
	// its image resolved as a create's (a reference pulled now, under the
	// caller's rules, when images.allow_pull lets it). The template keeps
	// the image as given: its creates resolve it again.
	probe := templateCreate(&req)
	if err := e.resolveContainerImage(ctx, &probe, nil); err != nil {
		return nil, err
	}
	if _, err := e.sandboxSpec(probe); err != nil {
		return nil, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "encode template")
	}
	rec := &store.TemplateRecord{Name: req.Name, Spec: b, CreatedAt: time.Now().UTC()}
	switch err := e.store.InsertTemplate(ctx, rec); {
	case errors.Is(err, store.ErrExists):
		return nil, errdefs.Conflictf("name: template %q exists", req.Name)
	case err != nil:
		return nil, errdefs.Wrap(errdefs.Internal, err, "record template")
	}
	e.sandboxes.SetPool(sandbox.TemplatePoolKey(req.Name), req.Pool)
	return e.publicTemplate(rec, req), nil
}

// templateCreate is the create request a template's defaults make.
func templateCreate(t *apitypes.TemplateCreateRequest) CreateSandboxRequest {
	return CreateSandboxRequest{Image: t.Image, Language: t.Image, MemoryMB: t.MemoryMB, CPUs: t.CPUs, DiskMB: t.DiskMB,
		Network: t.Network, Allow: t.Allow, Env: maps.Clone(t.Env)}
}

func (e *Engine) publicTemplate(rec *store.TemplateRecord, t apitypes.TemplateCreateRequest) *apitypes.Template {
	return &apitypes.Template{TemplateCreateRequest: t, CreatedAt: rec.CreatedAt,
		Warm: len(e.sandboxes.WarmIDs(sandbox.TemplatePoolKey(t.Name)))}
}

// template loads template name; field names the request field for errors.
func (e *Engine) template(ctx context.Context, field, name string) (*store.TemplateRecord, *apitypes.TemplateCreateRequest, error) {
	if err := volumes.CheckName(field, name); err != nil {
		return nil, nil, err
	}
	rec, err := e.store.GetTemplate(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, errdefs.NotFoundf("%s: no template %q", field, name)
	}
	if err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "look up template %s", name)
	}
	var t apitypes.TemplateCreateRequest
	if err := json.Unmarshal(rec.Spec, &t); err != nil {
		return nil, nil, errdefs.Wrap(errdefs.Internal, err, "decode template %s", name)
	}
	return rec, &t, nil
}

// GetTemplate describes template name.
func (e *Engine) GetTemplate(ctx context.Context, name string) (*apitypes.Template, error) {
	rec, t, err := e.template(ctx, "name", name)
	if err != nil {
		return nil, err
	}
	return e.publicTemplate(rec, *t), nil
}

// ListTemplates lists the templates by name.
func (e *Engine) ListTemplates(ctx context.Context) (*apitypes.TemplateList, error) {
	recs, err := e.store.ListTemplates(ctx)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "list templates")
	}
	out := &apitypes.TemplateList{Templates: []apitypes.Template{}}
	for _, rec := range recs {
		var t apitypes.TemplateCreateRequest
		if err := json.Unmarshal(rec.Spec, &t); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "decode template %s", rec.Name)
		}
		out.Templates = append(out.Templates, *e.publicTemplate(rec, t))
	}
	return out, nil
}

// DeleteTemplate removes template name and ends its warm sandboxes;
// sandboxes already made from it keep running.
func (e *Engine) DeleteTemplate(ctx context.Context, name string) error {
	if _, _, err := e.template(ctx, "name", name); err != nil {
		return err
	}
	if err := e.store.DeleteTemplate(ctx, name); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "delete template %s", name)
	}
	key := sandbox.TemplatePoolKey(name)
	e.sandboxes.SetPool(key, 0)
	for _, id := range e.sandboxes.WarmIDs(key) {
		if _, err := e.sandboxes.Terminate(ctx, id, "template "+name+" deleted"); err != nil {
			e.log.Error("end a warm sandbox of a deleted template", "sandbox", id, "err", err)
		}
	}
	return nil
}

// loadTemplatePools sizes the warm pool of every stored template (at start).
func (e *Engine) loadTemplatePools(ctx context.Context) error {
	recs, err := e.store.ListTemplates(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		var t apitypes.TemplateCreateRequest
		if json.Unmarshal(rec.Spec, &t) == nil && t.Pool > 0 {
			e.sandboxes.SetPool(sandbox.TemplatePoolKey(t.Name), t.Pool)
		}
	}
	return nil
}

// applyTemplate fills a create request from its template: the template's
// image (a request naming another is refused), and its limits, network
// and environment wherever the request leaves them unset (the request's
// env is laid over the template's).
func (e *Engine) applyTemplate(ctx context.Context, req *CreateSandboxRequest) (*apitypes.TemplateCreateRequest, error) {
	_, t, err := e.template(ctx, "template", req.Template)
	if err != nil {
		return nil, err
	}
	if req.Backend == BackendVM {
		return nil, errdefs.Invalidf("template: not with backend vm")
	}
	if req.FromSnapshot != "" {
		return nil, errdefs.Invalidf("template: not with from_snapshot (a fork has its snapshot's image)")
	}
	for field, v := range map[string]string{"image": req.Image, "language": req.Language} {
		if v != "" && v != t.Image {
			return nil, errdefs.Invalidf("%s: %q, but template %s runs image %q", field, v, t.Name, t.Image)
		}
	}
	req.Image, req.Language = t.Image, t.Image
	if req.MemoryMB == nil {
		req.MemoryMB = t.MemoryMB
	}
	if req.CPUs == nil {
		req.CPUs = t.CPUs
	}
	if req.DiskMB == nil {
		req.DiskMB = t.DiskMB
	}
	if req.Network == "" {
		req.Network, req.Allow = t.Network, t.Allow
	}
	if len(t.Env) > 0 {
		env := maps.Clone(t.Env)
		maps.Copy(env, req.Env)
		req.Env = env
	}
	return t, nil
}

// templatePoolSpec is the spec of a warm sandbox of template name.
func (e *Engine) templatePoolSpec(name string) (sandbox.Spec, error) {
	req := CreateSandboxRequest{Template: name}
	if _, err := e.applyTemplate(context.Background(), &req); err != nil {
		return sandbox.Spec{}, err
	}
	if oci.IsReference(req.Image) {
		// A refill runs for no caller: it takes the image as pulled, and
		// never pulls (that is a create's, under its caller's rules).
		local, err := e.imgs.Pulled("image", req.Image)
		if err != nil {
			return sandbox.Spec{}, err
		}
		req.Image, req.Language = local, local
	}
	spec, err := e.sandboxSpec(req)
	if err != nil {
		return sandbox.Spec{}, err
	}
	spec.Template = name
	return *spec, nil
}

// readyTemplate starts template t's start command in sandbox id (unless a
// job runs there already: a warm sandbox whose start command the pool
// started) and waits until its readiness check passes or its timeout ends.
func (e *Engine) readyTemplate(ctx context.Context, id string, t *apitypes.TemplateCreateRequest) error {
	if t.StartCommand == "" && t.Ready == nil {
		return nil
	}
	if t.StartCommand != "" {
		jobs, err := e.ListJobs(ctx, id)
		if err != nil {
			return err
		}
		if len(jobs) == 0 {
			if _, err := e.StartJob(ctx, ExecRequest{SandboxID: id, Command: t.StartCommand}); err != nil {
				return fmt.Errorf("template %s: start command: %w", t.Name, err)
			}
		}
	}
	timeout := defaultReadyTimeout
	if t.Ready.TimeoutSeconds > 0 {
		timeout = time.Duration(t.Ready.TimeoutSeconds) * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if t.Ready.Port != 0 {
			conn, err := e.sandboxes.DialPort(rctx, id, t.Ready.Port)
			if err == nil {
				conn.Close()
				return nil
			}
			last = err
		} else {
			res, err := e.Exec(rctx, ExecRequest{SandboxID: id, Command: t.Ready.Command}, nil)
			if err == nil && res.ExitCode == 0 {
				return nil
			}
			if err != nil {
				last = err
			} else {
				last = fmt.Errorf("exit %d: %s", res.ExitCode, strings.TrimSpace(res.Stderr))
			}
		}
		select {
		case <-rctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errdefs.Unavailablef("template: %s not ready within %s (ready.timeout_seconds): %v", t.Name, timeout, last)
		case <-time.After(readyPoll):
		}
	}
}
