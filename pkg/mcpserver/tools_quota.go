package mcpserver

import (
	"context"
	"fmt"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

type quotaUsageIn struct{}

// addQuotaTool adds quota_usage: the caller's own key's quota and use, so
// that an agent can see why a create was refused and what frees it.
func (s *srv) addQuotaTool() {
	addTool[quotaUsageIn, apitypes.KeyUsage](s, "quota_usage", "Show quota usage",
		"Show the quota of the API key this session authenticated with and what its live sandboxes use of it: sandboxes, memory_mb, cpus, disk_mb, creates_per_minute (0: no limit). A create that would exceed one fails with limit_exceeded naming it; terminating sandboxes frees their share.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *quotaUsageIn) (*result, error) {
			u, err := s.e.KeyUsage(ctx, "")
			if err != nil {
				return nil, err
			}
			q := u.Quota
			text := fmt.Sprintf("key %s (tenant %s): sandboxes %d/%d, memory %d/%d MiB, cpus %g/%g, disk %d/%d MiB, creates in the last minute %d/%d (0: no limit)",
				u.Name, u.Tenant, u.Use.Sandboxes, q.Sandboxes, u.Use.MemoryMB, q.MemoryMB, u.Use.CPUs, q.CPUs, u.Use.DiskMB, q.DiskMB, u.Use.CreatesLastMinute, q.CreatesPerMinute)
			return &result{structured: *u, text: text}, nil
		})
}
