package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

type (
	// AutofixRequest is the body of POST /v1/autofix.
	AutofixRequest = apitypes.AutofixRequest
	// AutofixSubmitRequest is the body of POST /v1/autofix/{id}/submit.
	AutofixSubmitRequest = apitypes.AutofixSubmitRequest
	// AutofixResult is the answer of the autofix endpoints.
	AutofixResult = apitypes.AutofixResult
	// AutofixEvent is a line of the autofix stream.
	AutofixEvent = apitypes.AutofixEvent
	// AutofixAttempt is one attempt of a loop.
	AutofixAttempt = apitypes.AutofixAttempt
	// CorrectionRecord is one line of `runs export`.
	CorrectionRecord = apitypes.CorrectionRecord
)

// autofixLine is a line of the stream: an event, or the error that ended
// the loop.
type autofixLine = apitypes.AutofixLine

// Autofix runs the autofix loop (POST /v1/autofix); onEvent, if not nil,
// sees each attempt and fix as it happens.
func (c *Client) Autofix(ctx context.Context, req AutofixRequest, onEvent func(AutofixEvent)) (*AutofixResult, error) {
	return c.autofixStream(ctx, "/v1/autofix", req, onEvent)
}

// AutofixSubmit answers a loop waiting at needs_fix (POST
// /v1/autofix/{id}/submit).
func (c *Client) AutofixSubmit(ctx context.Context, req AutofixSubmitRequest, onEvent func(AutofixEvent)) (*AutofixResult, error) {
	return c.autofixStream(ctx, "/v1/autofix/"+url.PathEscape(req.AutofixID)+"/submit", req, onEvent)
}

// AutofixStatus reports a loop (GET /v1/autofix/{id}).
func (c *Client) AutofixStatus(ctx context.Context, id string) (*AutofixResult, error) {
	var out AutofixResult
	if err := c.doJSON(ctx, http.MethodGet, "/v1/autofix/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) autofixStream(ctx context.Context, path string, body any, onEvent func(AutofixEvent)) (*AutofixResult, error) {
	return postStream(ctx, c, path, nil, body, "autofix", func(line *autofixLine) (bool, *AutofixResult, error) {
		switch {
		case line.Error != nil:
			return true, nil, line.Error.Err()
		case line.Type == "result" && line.Result != nil:
			return true, line.Result, nil
		case onEvent != nil:
			onEvent(line.AutofixEvent)
		}
		return false, nil, nil
	})
}

// ExportCorrections reads the autofix corrections (GET
// /v1/runs/export?format=jsonl) and copies the JSON lines to w.
func (c *Client) ExportCorrections(ctx context.Context, w io.Writer) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/runs/export", url.Values{"format": {"jsonl"}}, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}
