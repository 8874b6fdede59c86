package runtime

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/sirupsen/logrus"
)

// routeLogrus sends libcontainer's logrus output (including messages that runc
// init forwards from inside a starting sandbox) to the daemon's slog logger.
// logrus is process-global, so only the first Runtime's logger is used.
func routeLogrus(log *slog.Logger) {
	if log == nil {
		return
	}
	logrusOnce.Do(func() {
		logrus.SetOutput(io.Discard)
		logrus.SetLevel(logrus.InfoLevel)
		logrus.AddHook(&slogHook{log: log.With("component", "libcontainer")})
	})
}

var logrusOnce sync.Once

type slogHook struct{ log *slog.Logger }

func (h *slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *slogHook) Fire(e *logrus.Entry) error {
	lvl := slog.LevelInfo
	switch {
	case e.Level <= logrus.ErrorLevel:
		lvl = slog.LevelError
	case e.Level == logrus.WarnLevel:
		lvl = slog.LevelWarn
	case e.Level >= logrus.DebugLevel:
		lvl = slog.LevelDebug
	}
	attrs := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		attrs = append(attrs, k, v)
	}
	h.log.Log(context.Background(), lvl, e.Message, attrs...)
	return nil
}
