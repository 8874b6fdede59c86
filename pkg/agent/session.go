package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// Session is an interactive connection to a job started with a TTY or with
// OpenStdin: input and resize requests flow to the agent while output
// flows back, which is what a WebSocket terminal bridge needs. Output must
// be drained (or the session closed) for Wait to return.
type Session struct {
	cn     *conn
	wmu    sync.Mutex // serialises frames towards the agent
	out    chan Chunk
	done   chan struct{}
	closed chan struct{}
	once   sync.Once
	exit   *ExitStatus
	err    error
}

// Interactive opens an interactive session on a running job. Output is
// streamed from the oldest retained byte.
func (c *Client) Interactive(ctx context.Context, jobID string) (*Session, error) {
	return c.InteractiveFrom(ctx, jobID, 0, 0)
}

// InteractiveFrom is Interactive with output streamed from the given
// offsets (the oldest retained byte when those are no longer retained):
// a client that takes over a session another had opened (a restarted
// daemon) starts where the output stands rather than replaying it.
func (c *Client) InteractiveFrom(ctx context.Context, jobID string, stdoutOff, stderrOff int64) (*Session, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	if stdoutOff < 0 || stderrOff < 0 {
		return nil, Errorf(errdefs.InvalidArgument, "negative output offset")
	}
	cn, err := c.do(ctx, &Request{Op: OpInteractive, JobID: jobID, StdoutOffset: stdoutOff, StderrOffset: stderrOff}, nil)
	if err != nil {
		return nil, err
	}
	// The agent confirms before streaming, so that an unknown or finished
	// job is reported here rather than through Wait.
	if _, err := cn.expect(FrameResult, 0); err != nil {
		cn.close()
		return nil, err
	}
	s := &Session{
		cn:     cn,
		out:    make(chan Chunk, 16),
		done:   make(chan struct{}),
		closed: make(chan struct{}),
	}
	go s.readLoop()
	return s, nil
}

func (s *Session) readLoop() {
	defer close(s.done)
	defer close(s.out)
	next := map[string]int64{StreamStdout: 0, StreamStderr: 0}
	for {
		f, err := s.cn.frame(MaxChunkBytes)
		if err != nil {
			s.err = err
			return
		}
		switch f.Type {
		case FrameOutput:
			ch, err := s.cn.chunk(f, next)
			if err != nil {
				s.err = err
				return
			}
			select {
			case s.out <- ch:
			case <-s.closed:
				s.err = fmt.Errorf("agent: session closed")
				return
			}
		case FrameExit:
			if err := validateExit(f.Exit); err != nil {
				s.err = err
				return
			}
			s.exit = f.Exit
			return
		default:
			s.err = fmt.Errorf("%w: unexpected %q frame in session", ErrProtocol, f.Type)
			return
		}
	}
}

// Output returns the channel of output chunks; it is closed when the job
// has finished or the session failed or was closed.
func (s *Session) Output() <-chan Chunk { return s.out }

// send writes one frame and its payload.
func (s *Session) send(f *Frame, payload []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	f.V = ProtocolVersion
	f.Len = int64(len(payload))
	if err := WriteHeader(s.cn.w, f); err != nil {
		return s.cn.wrap(err)
	}
	if _, err := s.cn.w.Write(payload); err != nil {
		return s.cn.wrap(err)
	}
	return s.cn.wrap(s.cn.w.Flush())
}

// Write sends p to the job's stdin (the terminal's input for a TTY job).
func (s *Session) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), MaxChunkBytes)
		if err := s.send(&Frame{Type: FrameStdin}, p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// CloseStdin closes the job's stdin; for a TTY job it sends the terminal's
// end-of-file character.
func (s *Session) CloseStdin() error { return s.send(&Frame{Type: FrameCloseStdin}, nil) }

// Resize changes the size of the job's terminal.
func (s *Session) Resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return Errorf(errdefs.InvalidArgument, "terminal size %dx%d", rows, cols)
	}
	return s.send(&Frame{Type: FrameResize, Rows: rows, Cols: cols}, nil)
}

// Wait blocks until the output stream ends and returns the job's exit
// status.
func (s *Session) Wait() (*ExitStatus, error) {
	<-s.done
	return s.exit, s.err
}

// Close ends the session; the job keeps running.
func (s *Session) Close() error {
	s.once.Do(func() {
		close(s.closed)
		s.cn.close()
	})
	return nil
}
