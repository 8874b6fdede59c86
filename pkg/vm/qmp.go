package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// monitor is a QMP connection through go-qemu's SocketMonitor, made safe
// against the library's three traps (docs/vm.md "go-qemu's three traps"):
//
//  1. go-qemu has no timeouts: Connect and Run block for ever on a wedged
//     QEMU. Every call here runs under a deadline; when it passes the
//     connection is closed (which unblocks go-qemu's reader) and dropped,
//     and the next call dials again.
//  2. Once anyone listens for events, go-qemu's reader blocks on each one
//     until it is received, and with it every Run. The event channel is
//     drained by a goroutine from the moment of connecting, whatever
//     happens to the events.
//  3. Replies longer than 64 KiB kill go-qemu's reader (bufio.Scanner).
//     Only commands with short replies are sent (no query-qmp-schema, no
//     large HMP "info" output); screendump writes to a file.
type monitor struct {
	path    string
	timeout time.Duration

	mu  sync.Mutex
	mon *qmp.SocketMonitor
	// onEvent sees every event; it must not block.
	onEvent func(qmp.Event)
}

func newMonitor(path string, timeout time.Duration, onEvent func(qmp.Event)) *monitor {
	return &monitor{path: path, timeout: timeout, onEvent: onEvent}
}

// connectLocked dials and performs the capabilities handshake under the
// monitor's timeout.
func (m *monitor) connectLocked(ctx context.Context) error {
	if m.mon != nil {
		return nil
	}
	mon, err := qmp.NewSocketMonitor("unix", m.path, m.timeout)
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "qmp: dial %s", m.path)
	}
	done := make(chan error, 1)
	go func() { done <- mon.Connect() }()
	t := time.NewTimer(m.timeout)
	defer t.Stop()
	select {
	case err = <-done:
	case <-t.C:
		err = errors.New("no greeting in time")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = mon.Disconnect() // unblocks Connect's reads
		return errdefs.Wrap(errdefs.Unavailable, err, "qmp: connect %s", m.path)
	}
	events, _ := mon.Events(context.Background())
	go func() {
		for e := range events { // closed when the connection ends
			if m.onEvent != nil {
				m.onEvent(e)
			}
		}
	}()
	m.mon = mon
	return nil
}

// dropLocked closes the connection; go-qemu's reader ends and closes the
// event channel, which ends the drain goroutine.
func (m *monitor) dropLocked() {
	if m.mon != nil {
		mon := m.mon
		m.mon = nil
		go func() { _ = mon.Disconnect() }() // Disconnect drains the reply stream; never block on it
	}
}

// close closes the connection and waits (briefly) until it is closed, so
// that another client can connect right after: QEMU serves one at a time.
func (m *monitor) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mon == nil {
		return
	}
	mon := m.mon
	m.mon = nil
	done := make(chan struct{})
	go func() { _ = mon.Disconnect(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
}

// run executes one QMP command and returns its "return" value.
func (m *monitor) run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return m.runWithFile(ctx, cmd, args, nil)
}

// runWithFile is run passing f to QEMU with the command (SCM_RIGHTS), as
// add-fd wants.
func (m *monitor) runWithFile(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.connectLocked(ctx); err != nil {
		return nil, err
	}
	req, err := json.Marshal(qmp.Command{Execute: cmd, Args: args})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "qmp %s: encode", cmd)
	}
	type result struct {
		b   []byte
		err error
	}
	mon := m.mon
	done := make(chan result, 1)
	go func() {
		b, err := mon.RunWithFile(req, f)
		done <- result{b, err}
	}()
	t := time.NewTimer(m.timeout)
	defer t.Stop()
	var r result
	select {
	case r = <-done:
	case <-t.C:
		m.dropLocked()
		return nil, errdefs.Unavailablef("qmp %s: no reply within %s", cmd, m.timeout)
	case <-ctx.Done():
		m.dropLocked()
		return nil, errdefs.Wrap(errdefs.Unavailable, ctx.Err(), "qmp %s", cmd)
	}
	if r.err != nil {
		// go-qemu returns QEMU's error replies as plain errors (their
		// desc). A closed reply stream shows as decoding nothing ("unexpected
		// end of JSON input"); then the connection is gone: redial next time.
		if strings.Contains(r.err.Error(), "unexpected end of JSON input") || errors.Is(r.err, net.ErrClosed) {
			m.dropLocked()
		}
		return nil, fmt.Errorf("qmp %s: %w", cmd, r.err)
	}
	var rep struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(r.b, &rep); err != nil {
		m.dropLocked()
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "qmp %s: reply", cmd)
	}
	return rep.Return, nil
}

// hmp runs a human monitor command. HMP reports failures as text with a
// successful QMP reply; such text is turned into an error.
func (m *monitor) hmp(ctx context.Context, line string) (string, error) {
	raw, err := m.run(ctx, "human-monitor-command", map[string]string{"command-line": line})
	if err != nil {
		return "", err
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", errdefs.Wrap(errdefs.Unavailable, err, "hmp %s: reply", line)
	}
	out = strings.TrimSpace(strings.ReplaceAll(out, "\r\n", "\n"))
	if strings.HasPrefix(out, "Error:") || strings.Contains(out, "\nError:") {
		return out, fmt.Errorf("hmp %q: %s", line, out)
	}
	return out, nil
}
