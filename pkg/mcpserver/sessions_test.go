package mcpserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/server"
)

// TestUnknownSessionRefused: over mcp-go's streamable HTTP server with the
// daemon's session manager, a session id the server issued works, one it
// never issued (well-formed, as mcp-go's default would accept) and an ended
// one are refused with 404 and the taxonomy's JSON.
func TestUnknownSessionRefused(t *testing.T) {
	sessions := newIssuedSessions()
	h := server.NewStreamableHTTPServer(server.NewMCPServer("t", "1"), server.WithSessionIdManager(sessions))
	ts := httptest.NewServer(refuseUnknownSessions(sessions, h))
	defer ts.Close()
	post := func(session, body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set(server.HeaderKeySessionID, session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	resp.Body.Close()
	id := resp.Header.Get(server.HeaderKeySessionID)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(id, sessionIDPrefix) {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, id)
	}
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if resp := post(id, ping); resp.StatusCode != http.StatusOK {
		t.Errorf("ping in the issued session: %d", resp.StatusCode)
	}
	refused := func(session, want string) {
		t.Helper()
		resp := post(session, ping)
		defer resp.Body.Close()
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		err := json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusNotFound || err != nil || body.Error.Code != "not_found" || !strings.Contains(body.Error.Message, want) {
			t.Errorf("session %q: %d %+v (%v), want 404 not_found %q", session, resp.StatusCode, body, err, want)
		}
	}
	refused(sessionIDPrefix+uuid.NewString(), "did not issue")
	refused("made-up", "did not issue")
	if _, err := sessions.Terminate(id); err != nil {
		t.Fatal(err)
	}
	refused(id, "ended")
}
