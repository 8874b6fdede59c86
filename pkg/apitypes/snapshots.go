package apitypes

import "time"

// SnapshotRequest is the input of sandbox_snapshot (POST
// /v1/sandboxes/{id}/snapshots).
type SnapshotRequest struct {
	SandboxID string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (ready, running or paused)."`
	Name      string `json:"name,omitempty" jsonschema_description:"Optional name: 1 to 64 letters, digits and ._- (starting with a letter or digit)."`
}

// Snapshot describes a workspace snapshot: a sandbox's /workspace, /tmp
// and root file system layer, archived at one moment.
type Snapshot struct {
	// ID is the hex sha256 of the snapshot's compressed archive.
	ID   string `json:"snapshot_id"`
	Name string `json:"name,omitempty"`
	// Kind is SnapshotFiles (a workspace archive on the host) or
	// SnapshotMemory (a VM's whole machine, kept in the VM's disk until it
	// is terminated; sandbox_restore of the same sandbox only).
	Kind        string     `json:"kind"`
	SandboxID   string     `json:"sandbox_id"` // the sandbox it was taken of
	Language    string     `json:"language"`
	Image       string     `json:"image"`
	ImageDigest string     `json:"image_digest"`
	DiskBacking string     `json:"disk_backing,omitempty"`
	Size        int64      `json:"size"`          // compressed bytes on the host
	ContentSize int64      `json:"content_bytes"` // bytes of its files
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	// ExcludedVolumes are "name:/path" of the named volumes the sandbox
	// had mounted: their files are not in the snapshot (a volume outlives
	// sandboxes and is shared; restoring it would overwrite what others
	// wrote), and a fork does not mount them.
	ExcludedVolumes []string `json:"excluded_volumes,omitempty"`
}

// Snapshot.Kind values.
const (
	SnapshotFiles  = "files"
	SnapshotMemory = "memory"
)

// RestoreRequest is the input of sandbox_restore (POST
// /v1/sandboxes/{id}/restore).
type RestoreRequest struct {
	SandboxID  string `json:"sandbox_id" jsonschema_description:"Id of a live sandbox (ready or running) to roll back; its running commands are killed."`
	SnapshotID string `json:"snapshot_id" jsonschema_description:"Snapshot to restore (sandbox_snapshot, snapshot_list); it must be of the sandbox's language."`
}

// SnapshotListRequest is the input of snapshot_list.
type SnapshotListRequest struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema_description:"Only snapshots taken of this sandbox."`
}

// SnapshotDeleteRequest is the input of snapshot_delete.
type SnapshotDeleteRequest struct {
	SnapshotID string `json:"snapshot_id" jsonschema_description:"Snapshot to delete."`
}
