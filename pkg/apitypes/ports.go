package apitypes

import "time"

// PreviewTokenParam is the query parameter that carries a preview token in
// a URL a browser opens; the preview listener turns it into a cookie and
// redirects to the URL without it.
const PreviewTokenParam = "sandboxd_preview_token"

// PreviewTokenHeader carries a preview token on requests from programs.
const PreviewTokenHeader = "X-Sandboxd-Preview-Token"

// PortExposure is a TCP port of a sandbox that the daemon's preview
// listener serves (HTTP and WebSocket), behind the exposure's own token.
type PortExposure struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
	// URL opens the port in a browser: it carries the token once as
	// PreviewTokenParam, which the listener exchanges for a cookie.
	URL string `json:"url"`
	// BaseURL is the same address without the token; programs send the
	// token in TokenHeader instead.
	BaseURL string `json:"base_url"`
	// HostURL, set when the listener is on the loopback, opens the port at
	// http://p{port}-{sandbox_id}.localhost:PORT/ (with the token once): an
	// origin of its own, and the application served at "/" (no path
	// prefix for absolute links to break).
	HostURL     string    `json:"host_url,omitempty"`
	Token       string    `json:"token"`
	TokenHeader string    `json:"token_header"`
	CreatedAt   time.Time `json:"created_at"`
}

// ExposePortRequest asks for a sandbox's port to be served by the preview
// listener.
type ExposePortRequest struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
}
