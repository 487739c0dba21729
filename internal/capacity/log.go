package capacity

import (
	"context"
	"fmt"
	"log/slog"
)

// LibraryLogger turns go-redis' log lines (a failed dial, a Sentinel
// switching masters) into debug records of log. The fleet reports a Redis
// outage once, itself; go-redis would log every failed dial. The commands
// install it with redis.SetLogger, which changes go-redis' global logger:
// this package does not, so that a program embedding it keeps its own.
func LibraryLogger(log *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return libraryLogger{log.With("component", "go-redis")}
}

type libraryLogger struct{ log *slog.Logger }

func (l libraryLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
	}
}
