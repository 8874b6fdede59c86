package engine

import (
	"context"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/tenants"
)

// Tenants is the key store and authenticator every front end shares.
func (e *Engine) Tenants() *tenants.Service { return e.tenants }

// requireAdmin refuses a caller with a user key: keys are managed by
// admins (and the unix socket, and the engine's own work).
func requireAdmin(ctx context.Context, what string) error {
	if p, ok := principal.From(ctx); ok && !p.Admin {
		return errdefs.PermissionDeniedf("%s: needs an admin key (this key %s is of scope user)", what, p.KeyName)
	}
	return nil
}

// CreateKey makes an API key (admin only); the answer holds its secret.
func (e *Engine) CreateKey(ctx context.Context, req apitypes.KeyCreateRequest) (*apitypes.KeySecret, error) {
	if err := requireAdmin(ctx, "keys create"); err != nil {
		return nil, err
	}
	return e.tenants.Create(ctx, req)
}

// ListKeys lists the API keys (admin only).
func (e *Engine) ListKeys(ctx context.Context) ([]apitypes.Key, error) {
	if err := requireAdmin(ctx, "keys list"); err != nil {
		return nil, err
	}
	return e.tenants.List(ctx)
}

// RevokeKey revokes key id (admin only): its next request is refused.
func (e *Engine) RevokeKey(ctx context.Context, id string) (*apitypes.Key, error) {
	if err := requireAdmin(ctx, "keys revoke"); err != nil {
		return nil, err
	}
	return e.tenants.Revoke(ctx, id)
}

// RotateKey gives key id a new secret (admin only).
func (e *Engine) RotateKey(ctx context.Context, id string) (*apitypes.KeySecret, error) {
	if err := requireAdmin(ctx, "keys rotate"); err != nil {
		return nil, err
	}
	return e.tenants.Rotate(ctx, id)
}

// KeyUsage is key id's quota and what its live sandboxes use of it; id ""
// is the caller's own key. A user key sees only its own, and another key's
// id is not_found for it, as if absent.
func (e *Engine) KeyUsage(ctx context.Context, id string) (*apitypes.KeyUsage, error) {
	p, ok := principal.From(ctx)
	if id == "" {
		if !ok || p.KeyID == "" {
			return nil, errdefs.Invalidf("key_id: required on the unix socket (it has no key of its own)")
		}
		id = p.KeyID
	}
	if ok && !p.Admin && id != p.KeyID {
		return nil, errdefs.NotFoundf("key_id: no key %q (or it is revoked)", id)
	}
	return e.tenants.Usage(id, e.sandboxes.HeldBy)
}

// maxTenantLabels bounds the tenant label of the per-tenant metrics:
// tenants past it are summed under "other", so a daemon with many keys
// cannot grow a scrape without bound.
const maxTenantLabels = 100

// tenantCollector exports what each tenant's live sandboxes hold, read at
// scrape time from the sandbox service (no counter to drift).
type tenantCollector struct {
	e                             *Engine
	sandboxes, memory, cpus, disk *prometheus.Desc
}

func newTenantCollector(e *Engine) *tenantCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("sandboxd_tenant_"+name, help, []string{"tenant"}, nil)
	}
	return &tenantCollector{e: e,
		sandboxes: d("sandboxes", "Live sandboxes by tenant (\"\": the unix socket's and the warm pool's; \"other\": tenants past the first 100)."),
		memory:    d("memory_bytes", "Sum of the memory limits of the tenant's live sandboxes."),
		cpus:      d("cpus", "Sum of the CPU limits of the tenant's live sandboxes."),
		disk:      d("disk_bytes", "Sum of the disk limits of the tenant's live sandboxes."),
	}
}

func (c *tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.memory
	ch <- c.cpus
	ch <- c.disk
}

func (c *tenantCollector) Collect(ch chan<- prometheus.Metric) {
	if c.e.sandboxes == nil {
		return
	}
	by := c.e.sandboxes.ByTenant()
	names := make([]string, 0, len(by))
	for t := range by {
		names = append(names, t)
	}
	sort.Strings(names)
	out := map[string]apitypes.KeyUse{}
	for i, t := range names {
		label := t
		if i >= maxTenantLabels {
			label = "other"
		}
		u, v := out[label], by[t]
		u.Sandboxes += v.Sandboxes
		u.MemoryMB += v.MemoryMB
		u.CPUs += v.CPUs
		u.DiskMB += v.DiskMB
		out[label] = u
	}
	for t, u := range out {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(u.Sandboxes), t)
		ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(u.MemoryMB)*mib, t)
		ch <- prometheus.MustNewConstMetric(c.cpus, prometheus.GaugeValue, u.CPUs, t)
		ch <- prometheus.MustNewConstMetric(c.disk, prometheus.GaugeValue, float64(u.DiskMB)*mib, t)
	}
}
