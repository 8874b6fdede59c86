package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// Artifact is an exported tar.gz of a sandbox directory.
type Artifact = apitypes.Artifact

// ExportFiles packs dir (default /workspace) of a sandbox into an artifact.
func (c *Client) ExportFiles(ctx context.Context, id, dir string) (*Artifact, error) {
	q := url.Values{}
	if dir != "" {
		q.Set("path", dir)
	}
	var art Artifact
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/export"), q, nil, &art, http.StatusCreated); err != nil {
		return nil, err
	}
	return &art, nil
}

// DownloadArtifact writes artifact id to w and returns how many bytes it wrote.
func (c *Client) DownloadArtifact(ctx context.Context, id string, w io.Writer) (int64, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/artifacts/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("download artifact %s: %w", id, err)
	}
	return n, nil
}
