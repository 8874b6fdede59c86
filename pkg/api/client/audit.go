package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// AuditVerify checks the daemon's audit log (GET /v1/audit/verify).
func (c *Client) AuditVerify(ctx context.Context) (*apitypes.AuditReport, error) {
	var r apitypes.AuditReport
	return &r, c.doJSON(ctx, http.MethodGet, "/v1/audit/verify", nil, nil, &r)
}

// AuditExport copies the audit records from since on (RFC 3339 or a
// duration back from now; empty: all) as OCSF API Activity JSON lines to w
// (GET /v1/audit/export).
func (c *Client) AuditExport(ctx context.Context, since string, w io.Writer) error {
	q := url.Values{}
	if since != "" {
		q.Set("since", since)
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/audit/export", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}
