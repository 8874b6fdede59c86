package engine

import (
	"context"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/snapshots"
)

// Snapshots are the snapshot service's (pkg/services/snapshots); these
// methods keep the engine the one facade the front ends' narrow interfaces
// are satisfied by.

// Crash points (internal/crashpoint) with the sandbox frozen: after the
// archive is written but not recorded, and after a restore's files are
// laid down but before the thaw.
const (
	CrashSnapshotFrozen = snapshots.CrashSnapshotFrozen
	CrashRestoreFrozen  = snapshots.CrashRestoreFrozen
)

// SnapshotSandbox archives a live sandbox's writable state (or, for a VM,
// saves its machine) and records it.
func (e *Engine) SnapshotSandbox(ctx context.Context, req apitypes.SnapshotRequest) (*apitypes.Snapshot, error) {
	return e.snapshots.Snapshot(ctx, req)
}

// GetSnapshot describes snapshot id.
func (e *Engine) GetSnapshot(ctx context.Context, id string) (*apitypes.Snapshot, error) {
	return e.snapshots.Get(ctx, id)
}

// ListSnapshots lists the snapshots, of sandboxID only when it is not
// empty, newest first.
func (e *Engine) ListSnapshots(ctx context.Context, sandboxID string) ([]apitypes.Snapshot, error) {
	return e.snapshots.List(ctx, sandboxID)
}

// DeleteSnapshot removes snapshot id: its row and its archive.
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	return e.snapshots.Delete(ctx, id)
}

// RestoreSandbox rolls live sandbox req.SandboxID back to snapshot
// req.SnapshotID.
func (e *Engine) RestoreSandbox(ctx context.Context, req apitypes.RestoreRequest) (*sandbox.Info, error) {
	return e.snapshots.Restore(ctx, req)
}

// machineSnapshotID is the snapshot_id of sandbox id's machine snapshot
// name (the engine's VM tests compute it).
func machineSnapshotID(id, name string) string { return snapshots.MachineSnapshotID(id, name) }
