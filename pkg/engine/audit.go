package engine

import (
	"context"
	"path/filepath"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/audit"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// openAudit opens the audit log (audit.enabled), its checkpoints kept in
// the state database. The front ends append to it; the engine only owns it
// so that every listener and the in-process stdio server share one chain.
func (e *Engine) openAudit() error {
	ac := e.cfg.Audit
	if !ac.Enabled {
		return nil
	}
	dir := ac.Dir
	if dir == "" {
		dir = filepath.Join(e.cfg.Paths.StateDir, "audit")
	}
	retention, total := time.Duration(ac.RetentionAge), int64(ac.MaxTotalBytes)
	if retention == 0 {
		retention = -1 // 0 in the configuration is "keep"
	}
	if total == 0 {
		total = -1
	}
	l, err := audit.Open(audit.Options{
		Dir: dir, MaxFileBytes: int64(ac.MaxFileBytes), MaxFileAge: time.Duration(ac.MaxFileAge),
		MaxTotalBytes: total, RetentionAge: retention, CheckpointEvery: uint64(ac.CheckpointEvery),
		VerifyInterval: time.Duration(ac.VerifyInterval),
		Checkpoints:    auditCheckpoints{e.store}, Log: e.log,
	})
	if err != nil {
		return err
	}
	e.audit = l
	return nil
}

// Audit returns the audit log; nil when audit.enabled is false (a nil
// *audit.Log records nothing).
func (e *Engine) Audit() *audit.Log { return e.audit }

// auditCheckpoints adapts the state database to audit.Checkpoints.
type auditCheckpoints struct{ s *store.Store }

func (a auditCheckpoints) SaveAuditCheckpoint(ctx context.Context, c audit.Checkpoint) error {
	return a.s.SaveAuditCheckpoint(ctx, store.AuditCheckpoint(c))
}

func (a auditCheckpoints) AuditCheckpoints(ctx context.Context) ([]audit.Checkpoint, error) {
	cs, err := a.s.AuditCheckpoints(ctx)
	out := make([]audit.Checkpoint, len(cs))
	for i, c := range cs {
		out[i] = audit.Checkpoint(c)
	}
	return out, err
}

func (a auditCheckpoints) DeleteAuditCheckpointsBefore(ctx context.Context, seq uint64) error {
	return a.s.DeleteAuditCheckpointsBefore(ctx, seq)
}
