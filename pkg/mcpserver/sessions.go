package mcpserver

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// sessionIDPrefix marks the ids issuedSessions hands out.
const sessionIDPrefix = "mcp-session-"

// maxTerminatedSessions bounds how many ended session ids are remembered
// (to answer "terminated" rather than "unknown"); older ones are forgotten
// and then answer "unknown", which clients treat the same way (404: start
// a new session).
const maxTerminatedSessions = 4096

// issuedSessions is the MCP session id manager: an id is valid only if this
// server issued it and it has not ended. mcp-go's default manager accepts
// any well-formed id without looking it up, so a client could attach to a
// session id it guessed or made up; a daemon restart forgets every id, and
// clients then start a new session (the protocol's answer to a 404).
type issuedSessions struct {
	mu         sync.Mutex
	live       map[string]bool
	terminated map[string]bool
	order      []string // terminated ids, oldest first
}

var _ server.SessionIdManager = (*issuedSessions)(nil)

func newIssuedSessions() *issuedSessions {
	return &issuedSessions{live: map[string]bool{}, terminated: map[string]bool{}}
}

var errUnknownSession = errors.New("unknown MCP session id")

// Generate implements server.SessionIdManager.
func (m *issuedSessions) Generate() string {
	id := sessionIDPrefix + uuid.NewString()
	m.mu.Lock()
	m.live[id] = true
	m.mu.Unlock()
	return id
}

// Validate implements server.SessionIdManager.
func (m *issuedSessions) Validate(id string) (terminated bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.live[id]:
		return false, nil
	case m.terminated[id]:
		return true, nil
	}
	return false, errUnknownSession
}

// Terminate implements server.SessionIdManager (a client's DELETE, the idle
// sweeper, shutdown).
func (m *issuedSessions) Terminate(id string) (notAllowed bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[id] {
		return false, nil
	}
	delete(m.live, id)
	m.terminated[id] = true
	m.order = append(m.order, id)
	if len(m.order) > maxTerminatedSessions {
		delete(m.terminated, m.order[0])
		m.order = m.order[1:]
	}
	return false, nil
}

// refuseUnknownSessions answers a request carrying a session id this
// server did not issue (or that has ended) with the error taxonomy's JSON
// (404 not_found) before it reaches mcp-go, whose own answer is plain text.
func refuseUnknownSessions(m *issuedSessions, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(server.HeaderKeySessionID)
		if id == "" {
			next.ServeHTTP(w, r)
			return
		}
		msg := "unknown MCP session id: this server did not issue it (start a new session with initialize)"
		switch terminated, err := m.Validate(id); {
		case err == nil && !terminated:
			next.ServeHTTP(w, r)
			return
		case terminated:
			msg = "MCP session ended (start a new session with initialize)"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": string(errdefs.NotFound), "message": msg}})
	})
}
