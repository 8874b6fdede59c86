package apitypes

import "time"

// VolumeMount mounts a named volume into a sandbox (sandbox_create
// volumes; shown in the sandbox's description).
type VolumeMount struct {
	Name     string `json:"name" jsonschema_description:"Volume name."`
	Path     string `json:"path" jsonschema_description:"Absolute mount path, e.g. /data; not a system directory."`
	ReadOnly bool   `json:"read_only,omitempty" jsonschema_description:"Mount it read-only."`
}

// VolumeCreateRequest is the input of volume_create (POST /v1/volumes).
type VolumeCreateRequest struct {
	Name   string `json:"name" jsonschema_description:"Volume name: 1 to 63 lowercase letters, digits and - (starting and ending with a letter or digit)."`
	SizeMB *int64 `json:"size_mb,omitempty" jsonschema_description:"Size in MiB (a full volume is ENOSPC inside every sandbox that mounts it). Default and maximum from the server configuration."`
	Inodes *int64 `json:"inodes,omitempty" jsonschema_description:"Maximum number of files and directories (default one per 16 KiB)."`
}

// VolumeRef names one volume (volume_get, volume_delete).
type VolumeRef struct {
	Name string `json:"name" jsonschema_description:"Volume name."`
}

// Volume describes a named volume: disk that outlives sandboxes.
type Volume struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"`
	Inodes    int64  `json:"inodes"`
	// UsedBytes and InodesUsed are what its file system holds now.
	UsedBytes  int64 `json:"used_bytes"`
	InodesUsed int64 `json:"inodes_used"`
	// Tenant owns it (the creator's tenant; empty without tenants);
	// CreatedBy is the creator's key name.
	Tenant    string    `json:"tenant,omitempty"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// UsedBy lists the live sandboxes that mount it.
	UsedBy []string `json:"used_by,omitempty"`
}

// VolumeList is the answer of volume_list (GET /v1/volumes).
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// VolumeDeleteResult is the answer of volume_delete.
type VolumeDeleteResult struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}
