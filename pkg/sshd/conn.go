package sshd

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/apitypes"
)

// conn is one authenticated SSH connection to one sandbox.
type conn struct {
	s     *Server
	sc    *ssh.ServerConn
	login login
	ctx   context.Context
	log   *slog.Logger

	mu       sync.Mutex
	sessions map[*session]struct{}
	// opening counts sessions between their open and add: a slot is
	// reserved before the channel is accepted, so that two opens racing
	// cannot both pass the maxSessions check and the client hears the
	// refusal at the open, whatever the scheduler does.
	opening int
	ended   string // why the connection's sessions were ended, once they were
	handles int    // files open through SFTP (sftp.go)
	wg      sync.WaitGroup
}

// globalRequests answers the connection-level requests: remote forwarding
// is refused (it would let the sandbox open connections to the client's
// side), anything else (OpenSSH's keepalive@openssh.com among them) gets
// the failure reply clients treat as "alive, not supported".
func (c *conn) globalRequests(reqs <-chan *ssh.Request) {
	for r := range reqs {
		switch r.Type {
		case "tcpip-forward", "streamlocal-forward@openssh.com":
			c.log.Warn("ssh remote forwarding refused", "request", r.Type)
		}
		if r.WantReply {
			_ = r.Reply(false, nil)
		}
	}
}

// watchSandbox ends the connection's sessions, with a message, when the
// sandbox leaves the live states, so a client sees why rather than a hang.
func (c *conn) watchSandbox() {
	for ev := range c.s.b.SubscribeEvents(c.ctx, c.login.sandboxID) {
		if ev.Type != "state" {
			continue
		}
		switch apitypes.State(ev.To) {
		case apitypes.StateTerminated, apitypes.StateFailed:
			msg := "sandbox " + c.login.sandboxID + " was " + ev.To
			if ev.Reason != "" {
				msg += " (" + ev.Reason + ")"
			}
			c.log.Info("ssh connection ended by the sandbox's end", "state", ev.To)
			c.endSessions(msg)
			_ = c.sc.Close()
			return
		}
	}
}

// keepalive asks the client for a reply every interval and closes the
// connection when three intervals pass without one (a vanished laptop must
// not hold a session, and the sandbox's idle timer, forever).
func (c *conn) keepalive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		answered := make(chan error, 1)
		go func() {
			_, _, err := c.sc.SendRequest("keepalive@openssh.com", true, nil)
			answered <- err
		}()
		timer := time.NewTimer(3 * interval)
		select {
		case err := <-answered:
			timer.Stop()
			if err != nil {
				return
			}
		case <-timer.C:
			c.log.Info("ssh client stopped answering keep-alives; closing")
			_ = c.sc.Close()
			return
		case <-c.ctx.Done():
			timer.Stop()
			return
		}
	}
}

// reserve takes a session slot for a channel about to be accepted; false
// when all maxSessions are taken (open or being opened).
func (c *conn) reserve() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sessions)+c.opening >= maxSessions {
		return false
	}
	c.opening++
	return true
}

// add turns a slot taken by reserve into the open session s; false when
// the connection's sessions were ended meanwhile. The slot is given back
// either way.
func (c *conn) add(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opening--
	if c.ended != "" {
		return false
	}
	if c.sessions == nil {
		c.sessions = map[*session]struct{}{}
	}
	c.sessions[s] = struct{}{}
	c.wg.Add(1)
	return true
}

// unreserve gives back a slot whose channel was never accepted.
func (c *conn) unreserve() {
	c.mu.Lock()
	c.opening--
	c.mu.Unlock()
}

func (c *conn) remove(s *session) {
	c.mu.Lock()
	if _, ok := c.sessions[s]; ok {
		delete(c.sessions, s)
		c.wg.Done()
	}
	c.mu.Unlock()
}

// endSessions ends every open session, telling its client why (msg; empty
// when the client itself went away).
func (c *conn) endSessions(msg string) {
	c.mu.Lock()
	if c.ended == "" {
		c.ended = "ended"
		if msg != "" {
			c.ended = msg
		}
	}
	open := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		open = append(open, s)
	}
	c.mu.Unlock()
	for _, s := range open {
		s.finish(exitLost, msg)
	}
}
