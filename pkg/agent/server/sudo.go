package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// maxSudoRequest bounds a sudo client's request line (argv and environment).
const maxSudoRequest = 1 << 20

// ListenSudo opens the sudo channel's socket (agent.SudoSocket; see
// pkg/agent/sudo.go for the protocol and the security boundary).
func ListenSudo() (*net.UnixListener, error) {
	return net.ListenUnix("unix", &net.UnixAddr{Name: agent.SudoSocket, Net: "unix"})
}

// ServeSudo serves sudo clients on ln until it is closed.
func (s *Server) ServeSudo(ln *net.UnixListener) error {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Error("sudo: accept failed", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			if err := s.serveSudo(c); err != nil {
				s.log.Info("sudo request refused", "err", err)
				_ = json.NewEncoder(c).Encode(agent.SudoMessage{Error: err.Error()})
			}
		}()
	}
}

// serveSudo runs one client's command and answers with its exit status.
func (s *Server) serveSudo(c *net.UnixConn) error {
	if err := checkSudoPeer(c); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(requestTimeout))
	req, fds, rest, err := readSudoRequest(c)
	if err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Time{})
	uid, gid := req.UID, req.GID
	er := &agent.ExecRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, UID: &uid, GID: &gid}
	argv0, env, cwd, cred, err := s.jobs.prepare(er)
	if err != nil {
		closeFDs(fds[:])
		return err
	}
	j, err := s.jobs.launch(er, argv0, env, cwd, cred, &childFDs{child: fds}, nil, true)
	if err != nil {
		return err
	}
	s.log.Info("sudo: command started", "job", j.id, "uid", uid, "argv0", argv0)
	// The client forwards the signals it gets; its going away (killed,
	// or its terminal closed) ends the command too, so that nothing it
	// started as root outlives it unseen.
	go func() {
		dec := json.NewDecoder(io.MultiReader(bytes.NewReader(rest), c))
		for {
			var m agent.SudoMessage
			if err := dec.Decode(&m); err != nil {
				j.kill(agent.CauseKilled, "the sudo client went away")
				return
			}
			if m.Signal != "" {
				_ = j.signal(m.Signal)
			}
		}
	}()
	return json.NewEncoder(c).Encode(agent.SudoMessage{Exit: j.wait()})
}

// checkSudoPeer refuses a peer outside the agent's PID namespace, whose
// pid SO_PEERCRED reports as 0: only the sandbox's own processes may ask.
func checkSudoPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred.Pid == 0 {
		return errors.New("the caller is not a process of this sandbox")
	}
	return nil
}

// readSudoRequest reads the request line and the three descriptors sent
// with it; rest is what was read past the line.
func readSudoRequest(c *net.UnixConn) (req agent.SudoRequest, fds [3]int, rest []byte, err error) {
	fds = [3]int{-1, -1, -1}
	var line []byte
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	got := false
	for {
		n, oobn, _, _, rerr := c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			received, perr := parseRights(oob[:oobn])
			if perr != nil {
				closeFDs(fds[:])
				return req, fds, nil, perr
			}
			if got || len(received) != 3 {
				// A second set, or a wrong count: a client of the
				// sandbox must not make PID 1 hold descriptors it
				// will never use.
				closeFDs(fds[:])
				closeFDs(received)
				return req, fds, nil, fmt.Errorf("sudo request: %d descriptors sent (again: %v), want 3 once (stdin, stdout, stderr)", len(received), got)
			}
			copy(fds[:], received)
			got = true
		}
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, rest = line[:i], line[i+1:]
			break
		}
		if rerr != nil || n == 0 || len(line) > maxSudoRequest {
			closeFDs(fds[:])
			if len(line) > maxSudoRequest {
				return req, fds, nil, fmt.Errorf("sudo request: longer than %d bytes", maxSudoRequest)
			}
			return req, fds, nil, fmt.Errorf("sudo request: incomplete: %v", rerr)
		}
	}
	if !got {
		return req, fds, nil, errors.New("sudo request: no descriptors sent")
	}
	if err := json.Unmarshal(line, &req); err != nil {
		closeFDs(fds[:])
		return req, fds, nil, fmt.Errorf("sudo request: %w", err)
	}
	return req, fds, rest, nil
}

// parseRights returns the descriptors of the SCM_RIGHTS messages in oob.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("sudo request: control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("sudo request: control message: %w", err)
		}
		fds = append(fds, got...)
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// wait blocks until j has finished and returns its exit status.
func (j *job) wait() *agent.ExitStatus {
	for {
		j.mu.Lock()
		exit, ch := j.exit, j.changed
		j.mu.Unlock()
		if exit != nil {
			return exit
		}
		<-ch
	}
}
