package mcpserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// runLogURI is the resource template of run records' logs: a client (Claude
// Code's @-mentions, ReadMcpResource) reads run://RUN_ID/stdout.log and
// run://RUN_ID/stderr.log, the logs run_code's cut output points at.
const runLogURI = "run://{run_id}/{log}"

// maxResourceBytes caps one log read as a resource; the rest is named by a
// marker (the record's directory holds it whole).
const maxResourceBytes = 1 << 20

// addRunResources registers the run record logs as a resource template.
func (s *srv) addRunResources() {
	s.mcp.AddResourceTemplate(mcp.NewResourceTemplate(runLogURI, "Run log",
		mcp.WithTemplateTitle("Output log of a run record"),
		mcp.WithTemplateDescription("stdout.log or stderr.log of a run record (run_code, autofix): run://RUN_ID/stdout.log. The first MiB; the record's directory (run_get: dir) holds the rest."),
		mcp.WithTemplateMIMEType("text/plain"),
	), func(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		uri := req.Params.URI
		id, log, ok := strings.Cut(strings.TrimPrefix(uri, "run://"), "/")
		if !strings.HasPrefix(uri, "run://") || !ok || id == "" || (log != "stdout.log" && log != "stderr.log") {
			return nil, errdefs.Invalidf("uri: want run://RUN_ID/stdout.log or run://RUN_ID/stderr.log, got %q", uri)
		}
		rec, err := s.e.GetRun(ctx, id, maxResourceBytes)
		if err != nil {
			return nil, err
		}
		text, truncated := rec.Stdout, rec.StdoutTruncated
		if log == "stderr.log" {
			text, truncated = rec.Stderr, rec.StderrTruncated
		}
		if truncated {
			text += fmt.Sprintf("\n[... cut at %d bytes; the whole log is %s ...]\n", maxResourceBytes, filepath.Join(rec.Dir, log))
		}
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/plain", Text: strings.ToValidUTF8(text, "\uFFFD")}}, nil
	})
}
