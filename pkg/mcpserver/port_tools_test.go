package mcpserver

import (
	"strings"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// TestExposePortTool checks sandbox_expose_port's answer and its errors;
// traffic through the preview listener is tested end to end in
// test/e2e (TestPreviewPort).
func TestExposePortTool(t *testing.T) {
	e := newEngine(t)
	c := newClient(t, e, Options{})
	id := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"}).ID

	// Before the daemon's preview listener is up, nothing is exposed.
	if code, msg := errCode(t, c.call("sandbox_expose_port", map[string]any{"sandbox_id": id, "port": 8000}, nil)); code != "unavailable" || !strings.Contains(msg, "server.preview_listen") {
		t.Errorf("without a listener: %s %q", code, msg)
	}
	e.SetPreviewURL("http://127.0.0.1:7071")
	x := ok[apitypes.PortExposure](c, "sandbox_expose_port", map[string]any{"sandbox_id": id, "port": 8000})
	if x.BaseURL != "http://127.0.0.1:7071/preview/"+id+"/8000/" || x.URL != x.BaseURL+"?sandboxd_preview_token="+x.Token || len(x.Token) != 48 {
		t.Errorf("exposure %+v", x)
	}
	if x.HostURL != "http://p8000-"+id+".localhost:7071/?sandboxd_preview_token="+x.Token {
		t.Errorf("host_url %q", x.HostURL)
	}
	if again := ok[apitypes.PortExposure](c, "sandbox_expose_port", map[string]any{"sandbox_id": id, "port": 8000}); again.Token != x.Token {
		t.Errorf("exposing again changed the token")
	}
	dead := ok[sandboxOut](c, "sandbox_create", map[string]any{"language": "shell"}).ID
	ok[apitypes.PortExposure](c, "sandbox_expose_port", map[string]any{"sandbox_id": dead, "port": 80})
	ok[sandboxTerminateOut](c, "sandbox_terminate", map[string]any{"sandbox_id": dead})
	if xs, err := e.Ports(t.Context(), dead); err != nil || len(xs) != 0 {
		t.Errorf("exposures of a terminated sandbox: %v %v", xs, err)
	}
	for _, tc := range []struct {
		args       map[string]any
		code, want string
	}{
		{map[string]any{"sandbox_id": id, "port": 0}, "invalid_argument", "port: 0 is not in 1-65535"},
		{map[string]any{"sandbox_id": id, "port": 65536}, "invalid_argument", "port: 65536"},
		{map[string]any{"sandbox_id": id, "port": "http"}, "invalid_argument", "port"},
		{map[string]any{"sandbox_id": id}, "invalid_argument", "port"},
		{map[string]any{"port": 80}, "invalid_argument", "sandbox_id"},
		{map[string]any{"sandbox_id": "sb-000000000000", "port": 80}, "not_found", "sandbox_id"},
		{map[string]any{"sandbox_id": dead, "port": 80}, "conflict", "sandbox_id: sandbox " + dead + " is terminated"},
	} {
		code, msg := errCode(t, c.call("sandbox_expose_port", tc.args, nil))
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%v: %s %q; want %s naming %q", tc.args, code, msg, tc.code, tc.want)
		}
	}
	if err := e.AuthorizePreview(id, 8000, x.Token); err != nil {
		t.Errorf("the exposure's token: %v", err)
	}
	if err := e.AuthorizePreview(id, 8001, x.Token); err == nil {
		t.Errorf("the token opened another port")
	}
}
