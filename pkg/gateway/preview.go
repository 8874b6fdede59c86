package gateway

import (
	"net"
	"net/http"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/services/ports"
)

// Preview returns the handler of gateway.preview_listen: preview URLs
// (/preview/{id}/{port}/… or the host name p{port}-{id}.localhost) proxied
// to the preview listener of the node that holds the sandbox, with the
// request's host, path and credentials as they came. The node checks the
// exposure's token (pkg/preview) exactly as for a direct caller: the
// gateway authenticates no one here, it only routes by the id's tag.
func (g *Gateway) Preview() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := previewID(r)
		if id == "" {
			writeError(w, errdefs.NotFoundf("preview: no such path; exposed ports are served at %s{sandbox_id}/{port}/", ports.PreviewPathPrefix))
			return
		}
		n, err := g.nodeOf(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		_, port, err := g.nodePorts(r.Context(), n)
		if err == nil && port == 0 {
			err = errdefs.Unavailablef("node %s serves no previews (server.preview_listen)", n.Name)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		if n.URL, err = listenerURL(n, port); err != nil {
			writeError(w, err)
			return
		}
		g.forwardTarget(w, r, n, target{mode: modePreview})
	})
}

// previewID is the sandbox id a preview request names (host-name form
// first, as the node's handler reads it), "" for none.
func previewID(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if label, ok := strings.CutSuffix(strings.ToLower(host), ports.PreviewHostSuffix); ok && strings.HasPrefix(label, "p") && !strings.Contains(label, ".") {
		if _, id, ok := strings.Cut(label, "-"); ok {
			return id
		}
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, ports.PreviewPathPrefix); ok {
		id, _, _ := strings.Cut(rest, "/")
		return id
	}
	return ""
}
