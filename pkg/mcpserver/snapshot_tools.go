package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Workspace snapshot tools (group sandbox): sandbox_snapshot,
// sandbox_restore, snapshot_list, snapshot_delete. A fork is sandbox_create
// with from_snapshot.

type snapshotListOut = apitypes.SnapshotList

type snapshotDeleteOut = apitypes.SnapshotDeleteResult

func (s *srv) addSnapshotTools() {
	expiry := "Snapshots are kept until snapshot_delete"
	if age := s.cfg.Snapshots.MaxAge.D(); age > 0 {
		expiry = fmt.Sprintf("Snapshots are deleted %s after they were taken (expires_at)", s.cfg.Snapshots.MaxAge)
	}
	addTool[apitypes.SnapshotRequest, apitypes.Snapshot](s, "sandbox_snapshot", "Snapshot a sandbox's files",
		joinLines(
			"Save a live sandbox's files — /workspace, /tmp and its root file system changes — as a snapshot, and return its snapshot_id (the sha256 of the compressed archive), size and created_at. The sandbox is frozen while the files are read (usually well under a second) and then continues.",
			"Use the snapshot_id with sandbox_restore {sandbox_id, snapshot_id} to roll a sandbox back, or sandbox_create {from_snapshot} to start a copy (a fork) on its own disk. Processes and memory are not saved, only files.",
			expiry+". Snapshotting unchanged files again returns the same snapshot.",
			"A VM (sandbox_create {backend: vm}) has no workspace snapshots: its whole machine (memory, devices, disk) is saved instead under name (kind memory; the same name replaces it), kept until the VM is terminated, for sandbox_restore of the same VM.",
		),
		annotations{},
		func(ctx context.Context, c *call, in *apitypes.SnapshotRequest) (*result, error) {
			snap, err := s.e.SnapshotSandbox(ctx, *in)
			if err != nil {
				return nil, err
			}
			if snap.Kind == apitypes.SnapshotMemory {
				return &result{structured: snap, text: fmt.Sprintf("machine snapshot %s (%s) of %s saved", snap.ID, snap.Name, snap.SandboxID)}, nil
			}
			return &result{structured: snap, text: fmt.Sprintf("snapshot %s of %s: %d bytes (%d bytes of files)", snap.ID, snap.SandboxID, snap.Size, snap.ContentSize)}, nil
		})
	addTool[apitypes.RestoreRequest, sandboxTerminateOut](s, "sandbox_restore", "Restore a sandbox from a snapshot",
		"Roll a live sandbox back to a snapshot of the same language: its running commands are killed, and /workspace and /tmp become exactly the snapshot's. The sandbox keeps its id, limits and network. A VM returns to one of its machine snapshots (kind memory): files written and processes started since are gone.",
		annotations{destructive: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.RestoreRequest) (*result, error) {
			info, err := s.e.RestoreSandbox(ctx, *in)
			if err != nil {
				return nil, err
			}
			out := sandboxTerminateOut{SandboxID: info.ID, State: string(info.State)}
			return &result{structured: out, text: fmt.Sprintf("sandbox %s restored from snapshot %s; it is %s", info.ID, in.SnapshotID, info.State)}, nil
		})
	addTool[apitypes.SnapshotListRequest, snapshotListOut](s, "snapshot_list", "List snapshots",
		"List workspace snapshots, newest first, optionally only those of one sandbox: snapshot_id, name, sandbox_id, language, size, created_at, expires_at.",
		annotations{readOnly: true, idempotent: true},
		func(ctx context.Context, c *call, in *apitypes.SnapshotListRequest) (*result, error) {
			l, err := s.e.ListSnapshots(ctx, in.SandboxID)
			if err != nil {
				return nil, err
			}
			lines := make([]string, 0, len(l))
			for _, sn := range l {
				lines = append(lines, fmt.Sprintf("%s %s %s %s %d bytes %s", sn.ID, sn.SandboxID, sn.Language, sn.CreatedAt.Format("2006-01-02T15:04:05Z"), sn.Size, sn.Name))
			}
			text := fmt.Sprintf("%d snapshots", len(l))
			if len(lines) > 0 {
				text += ":\n" + strings.Join(lines, "\n")
			}
			return &result{structured: snapshotListOut{Snapshots: l}, text: text}, nil
		})
	addTool[apitypes.SnapshotDeleteRequest, snapshotDeleteOut](s, "snapshot_delete", "Delete a snapshot",
		"Delete a workspace snapshot and its archive. Sandboxes forked from it keep their files.",
		annotations{destructive: true},
		func(ctx context.Context, c *call, in *apitypes.SnapshotDeleteRequest) (*result, error) {
			if err := s.e.DeleteSnapshot(ctx, in.SnapshotID); err != nil {
				return nil, err
			}
			return &result{structured: snapshotDeleteOut{SnapshotID: in.SnapshotID, Deleted: true}, text: "snapshot " + in.SnapshotID + " deleted"}, nil
		})
}
