package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
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
		n, err := g.NodeOf(r.Context(), id)
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

// SetPreviewURL is the address callers reach this gateway's preview
// listener at (gateway.preview_listen): exposures answered through the
// gateway name it instead of the node's listener, which callers of a
// fleet may not reach. Empty: the node's URLs pass unchanged.
func (g *Gateway) SetPreviewURL(base string) {
	g.previewMu.Lock()
	g.previewURL = strings.TrimSuffix(base, "/")
	g.previewMu.Unlock()
}

func (g *Gateway) previewBase() string {
	g.previewMu.Lock()
	defer g.previewMu.Unlock()
	return g.previewURL
}

// isExposureRoute says whether path answers exposures (expose, list).
func isExposureRoute(path string) bool {
	rest, ok := strings.CutPrefix(path, "/v1/sandboxes/")
	_, sub, _ := strings.Cut(rest, "/")
	return ok && sub == "ports"
}

// rewriteExposures points the exposures of a node's answer (an exposure,
// or {ports: [...]}) at the gateway's preview listener base (pointAt).
func rewriteExposures(res *http.Response, base string) error {
	bu, err := url.Parse(base)
	if err != nil || base == "" || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	res.Body.Close()
	if err != nil {
		return err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) == nil {
		if raw, ok := obj["ports"]; ok {
			var list []map[string]json.RawMessage
			if json.Unmarshal(raw, &list) == nil {
				for _, m := range list {
					pointAt(m, bu)
				}
				obj["ports"], _ = json.Marshal(list)
			}
		} else {
			pointAt(obj, bu)
		}
		if b, err := json.Marshal(obj); err == nil {
			body = append(b, '\n')
		}
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	res.ContentLength = int64(len(body))
	res.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// PointExposure points an exposure a node answered (the MCP engine's
// sandbox_expose_port) at this gateway's preview listener, as the REST
// answer is: the same rewrite (pointAt), not a copy. Without a preview
// URL it is left as the node made it.
func (g *Gateway) PointExposure(pe *apitypes.PortExposure) error {
	base := g.previewBase()
	bu, err := url.Parse(base)
	if err != nil || base == "" || pe == nil {
		return nil
	}
	b, err := json.Marshal(pe)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "exposure: encode")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "exposure: decode")
	}
	pointAt(m, bu)
	if b, err = json.Marshal(m); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "exposure: encode")
	}
	out := apitypes.PortExposure{}
	if err := json.Unmarshal(b, &out); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "exposure: decode")
	}
	*pe = out
	return nil
}

// pointAt points one exposure's URLs (url, base_url, host_url of its JSON
// form m) at the preview listener base bu: scheme and host replaced, path
// and token kept. The host-name form (host_url) is kept only when bu is on
// the loopback, with bu's port.
func pointAt(m map[string]json.RawMessage, bu *url.URL) {
	for _, k := range []string{"url", "base_url", "host_url"} {
		var s string
		if json.Unmarshal(m[k], &s) != nil || s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if k == "host_url" {
			host, _, _ := net.SplitHostPort(u.Host)
			ip := net.ParseIP(bu.Hostname())
			if ip == nil || !ip.IsLoopback() {
				delete(m, k)
				continue
			}
			u.Host = net.JoinHostPort(host, bu.Port())
		} else {
			u.Scheme, u.Host = bu.Scheme, bu.Host
			u.Path = strings.TrimSuffix(bu.Path, "/") + u.Path
		}
		m[k], _ = json.Marshal(u.String())
	}
}
