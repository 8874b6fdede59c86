package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/coder/websocket"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/engine"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox"
)

// maxTerminalInput bounds one client message on the terminal WebSocket (a
// paste, or a control message).
const maxTerminalInput = 1 << 20

// terminalMessage is a JSON text message on the terminal WebSocket
// (client.TerminalMessage on the other side).
type terminalMessage = apitypes.TerminalMessage

// terminal runs a command on a pseudo-terminal and bridges it to a
// WebSocket: binary messages carry the bytes both ways, text messages are
// JSON control ("resize" in, one "exit" out before a normal close).
//
// The terminal is opened before the upgrade so that a refused request (no
// such sandbox, bad command) gets an ordinary error response with its status.
func (s *server) terminal(w http.ResponseWriter, r *http.Request) {
	req := engine.TerminalRequest{
		SandboxID: r.PathValue("id"), Command: r.URL.Query().Get("cmd"),
		Argv: r.URL.Query()["argv"], Cwd: r.URL.Query().Get("cwd"),
	}
	var err error
	if req.Env, err = queryEnv(r); err == nil {
		if req.Rows, err = queryUint16(r, "rows"); err == nil {
			req.Cols, err = queryUint16(r, "cols")
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// A refused request (no such sandbox) keeps its own answer; a plain
	// HTTP request for a live sandbox is refused before a command starts.
	if _, err := s.e.GetSandbox(r.Context(), req.SandboxID); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !s.requireUpgrade(w, r) {
		return
	}
	term, err := s.e.OpenTerminal(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		// Accept has answered the client already.
		s.log.Debug("terminal upgrade", "err", err)
		_ = term.Close()
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxTerminalInput)

	ctx, cancel := context.WithCancel(r.Context())
	closed := make(chan struct{})
	go func() {
		// However the session ends (command exited, client gone, protocol
		// error), the terminal is closed, which kills a command still running.
		<-ctx.Done()
		if err := term.Close(); err != nil {
			s.log.Debug("terminal close", "sandbox", req.SandboxID, "err", err)
		}
		close(closed)
	}()
	defer func() {
		cancel()
		<-closed
	}()
	go s.terminalInput(ctx, cancel, conn, term)

	// Output must be drained to the end even when the client is gone:
	// the terminal's delivery would block otherwise.
	for chunk := range term.Output() {
		if ctx.Err() == nil && conn.Write(ctx, websocket.MessageBinary, chunk) != nil {
			cancel()
		}
	}
	res, err := term.Wait()
	if ctx.Err() != nil {
		return
	}
	b, err := json.Marshal(terminalExit(res, err))
	if err != nil {
		panic(err) // plain data: cannot fail
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return
	}
	_ = conn.Close(websocket.StatusNormalClosure, "")
}

// terminalExit is the terminal's last message: how the command ended, or
// the error that lost it.
func terminalExit(res *apitypes.ExecResult, err error) terminalMessage {
	exit := terminalMessage{Type: apitypes.TerminalExit}
	if err != nil {
		body := errorBodyOf(err)
		exit.Error = &body
	} else {
		exit.ExitCode, exit.Termination = &res.ExitCode, &res.Termination
	}
	return exit
}

// terminalInput forwards the client's messages to the terminal until the
// connection ends, then cancels the session.
func (s *server) terminalInput(ctx context.Context, cancel context.CancelFunc, conn *websocket.Conn, term *sandbox.Terminal) {
	defer cancel()
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if s.keyRevoked(ctx) {
			// Each message is a request of the key that opened the
			// terminal: a revoked or expired key's session ends here.
			_ = conn.Close(websocket.StatusPolicyViolation, "unauthenticated: missing or invalid API key")
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := term.Write(data); err != nil {
				s.log.Debug("terminal input", "err", err)
				return
			}
			continue
		}
		var m terminalMessage
		if err := json.Unmarshal(data, &m); err != nil || m.Type != apitypes.TerminalResize {
			_ = conn.Close(websocket.StatusUnsupportedData, `want {"type":"resize","rows":R,"cols":C}`)
			return
		}
		if err := term.Resize(m.Rows, m.Cols); err != nil {
			s.log.Debug("terminal resize", "err", err)
		}
	}
}

// events streams sandbox events (?sandbox_id= for one sandbox) as JSON text
// messages until the client goes away. The client sends nothing.
func (s *server) events(w http.ResponseWriter, r *http.Request) {
	if !s.requireUpgrade(w, r) {
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("events upgrade", "err", err)
		return
	}
	defer conn.CloseNow()
	// CloseRead answers pings and the close handshake; its context ends with
	// the connection, which ends the subscription.
	ctx := conn.CloseRead(r.Context())
	for ev := range s.e.SubscribeEvents(ctx, r.URL.Query().Get("sandbox_id")) {
		b, err := json.Marshal(ev)
		if err != nil {
			panic(err) // plain data: cannot fail
		}
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			return
		}
	}
}
