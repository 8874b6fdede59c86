package pipeline

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/principal"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/runs"
)

// ownRun says whether ctx's caller may see the run of md, and sets its
// tenant from its sandbox's record; owners caches sandbox id → tenant
// ("\x00" for a sandbox the caller may not see) over one listing.
func (s *Service) ownRun(ctx context.Context, md *runs.Metadata, owners map[string]string) bool {
	const hidden = "\x00"
	t, cached := owners[md.SandboxID]
	if !cached {
		t = hidden
		if info, err := s.sandboxes.Get(ctx, md.SandboxID); err == nil {
			t = info.Tenant
		} else if p, ok := principal.From(ctx); !ok || p.Admin {
			t = "" // its sandbox is gone from the database: an admin's only
		}
		if owners != nil {
			owners[md.SandboxID] = t
		}
	}
	if t == hidden {
		return false
	}
	md.Tenant = t
	return true
}

// ownRuns lists up to limit runs the caller may see: a user key's listing
// reads up to the store's maximum and keeps its own, so that other
// tenants' runs do not crowd its page out.
func (s *Service) ownRuns(ctx context.Context, limit int, list func(limit int) ([]runs.Metadata, error)) ([]runs.Metadata, error) {
	read := limit
	if p, ok := principal.From(ctx); ok && !p.Admin {
		read = 1000
	}
	all, err := list(read)
	if err != nil {
		return nil, err
	}
	owners := map[string]string{}
	out := all[:0]
	for i := range all {
		if len(out) == limit {
			break
		}
		if s.ownRun(ctx, &all[i], owners) {
			out = append(out, all[i])
		}
	}
	return out, nil
}
