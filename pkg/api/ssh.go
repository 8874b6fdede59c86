package api

import (
	"net/http"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// SSH access (pkg/sshd, pkg/services/sshkeys): the endpoint's address and
// host key, the registered public keys, and single-use login tokens.

func (s *server) routeSSH(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/ssh", s.sshEndpoint)
	mux.HandleFunc("GET /v1/ssh/keys", s.listSSHKeys)
	mux.HandleFunc("POST /v1/ssh/keys", s.addSSHKey)
	mux.HandleFunc("DELETE /v1/ssh/keys/{key}", s.removeSSHKey)
	mux.HandleFunc("POST /v1/sandboxes/{id}/ssh-token", s.sshToken)
	mux.HandleFunc("GET /v1/ssh/connect", s.sshConnect)
	// The same connection under a sandbox's path: a gateway routes it by
	// the id to the node that holds the sandbox (whose SSH endpoint the
	// login is for); the id decides nothing else.
	mux.HandleFunc("GET /v1/sandboxes/{id}/ssh/connect", s.sshConnect)
}

// sshConnect carries one SSH connection over a WebSocket (binary
// messages) to the SSH endpoint's handler. The bearer token let the
// request in; the SSH login inside still authenticates with a key or a
// token of its own, as on ssh.listen.
func (s *server) sshConnect(w http.ResponseWriter, r *http.Request) {
	if s.opt.SSHConn == nil {
		s.writeError(w, r, errdefs.Unavailablef("ssh: the SSH endpoint is off (ssh.listen)"))
		return
	}
	if !s.requireUpgrade(w, r) {
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("ssh upgrade", "err", err)
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	nc := websocket.NetConn(r.Context(), conn, websocket.MessageBinary)
	s.opt.SSHConn(nc)
}

func (s *server) sshEndpoint(w http.ResponseWriter, r *http.Request) {
	ep, err := s.e.SSHEndpoint(r.Context())
	s.reply(w, r, http.StatusOK, ep, err)
}

func (s *server) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	l, err := s.e.SSHKeyList(r.Context())
	s.reply(w, r, http.StatusOK, l, err)
}

func (s *server) addSSHKey(w http.ResponseWriter, r *http.Request) {
	var req apitypes.SSHKeyAddRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	k, err := s.e.SSHKeyAdd(r.Context(), req)
	s.reply(w, r, http.StatusCreated, k, err)
}

func (s *server) removeSSHKey(w http.ResponseWriter, r *http.Request) {
	if err := s.e.SSHKeyRemove(r.Context(), r.PathValue("key")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) sshToken(w http.ResponseWriter, r *http.Request) {
	var req apitypes.SSHTokenRequest
	if err := s.decodeFor(w, r, &req, "sandbox_id", &req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, err := s.e.SSHToken(r.Context(), req)
	s.reply(w, r, http.StatusOK, t, err)
}
