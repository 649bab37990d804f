package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// RedisLog forwards go-redis' own log lines (its connection pool's dial
// failures, reconnections) to a *slog.Logger instead of the standard
// error stream, where go-redis writes them by default. go-redis has one
// process-wide logger, so this package never installs it: call
//
//	redis.SetLogger(store.RedisLogger(logger))
//
// once in main. The Agent already logs every store outage with its cause
// (when it begins, then every 2 s), so the lines go out at Debug level,
// with the attribute "component"="go-redis". Safe for concurrent use.
type RedisLog struct {
	log *slog.Logger
}

// RedisLogger returns a RedisLog writing to l (nil: discard).
func RedisLogger(l *slog.Logger) *RedisLog {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &RedisLog{log: l.With("component", "go-redis")}
}

// Printf implements go-redis' logging interface.
func (r *RedisLog) Printf(ctx context.Context, format string, v ...any) {
	r.log.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}
