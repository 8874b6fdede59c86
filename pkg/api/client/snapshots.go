package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Snapshot is a workspace snapshot.
type Snapshot = apitypes.Snapshot

// SnapshotSandbox archives a live sandbox's writable state; name may be
// empty.
func (c *Client) SnapshotSandbox(ctx context.Context, id, name string) (*Snapshot, error) {
	var s Snapshot
	return &s, c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/snapshots"), nil, apitypes.SnapshotRequest{Name: name}, &s)
}

// RestoreSandbox rolls sandbox id back to snapshot snapshotID (its running
// commands are killed).
func (c *Client) RestoreSandbox(ctx context.Context, id, snapshotID string) (*Sandbox, error) {
	var s Sandbox
	return &s, c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/restore"), nil, apitypes.RestoreRequest{SnapshotID: snapshotID}, &s)
}

// Snapshots lists the snapshots, of sandboxID only if it is not empty.
func (c *Client) Snapshots(ctx context.Context, sandboxID string) ([]Snapshot, error) {
	var q url.Values
	if sandboxID != "" {
		q = url.Values{"sandbox_id": {sandboxID}}
	}
	var l struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	return l.Snapshots, c.doJSON(ctx, http.MethodGet, "/v1/snapshots", q, nil, &l)
}

// GetSnapshot describes one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	var s Snapshot
	return &s, c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, nil, &s)
}

// DeleteSnapshot deletes a snapshot and its archive.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}
