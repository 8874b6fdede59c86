//go:build !(cgo && seccomp)

package seccomp

import (
	"errors"
	"log/slog"
)

// MonitorSupported reports whether this build can receive notifications.
const MonitorSupported = false

// Monitor is unavailable without cgo and -tags seccomp.
type Monitor struct{}

// Listen fails: this build cannot receive seccomp notifications.
func Listen(string, func(int) string, *slog.Logger) (*Monitor, error) {
	return nil, errors.New("seccomp notifications need a cgo build with -tags seccomp")
}

func (m *Monitor) Close()                        {}
func (m *Monitor) Done() <-chan struct{}         { return nil }
func (m *Monitor) Take(string) map[string]uint64 { return nil }
