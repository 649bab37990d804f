package mnist

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/elastictrain/elastictrain/launch"
)

// Fields every log record of a worker carries, besides slog's own time,
// level and msg (docs/operations.md lists them with the per-event ones).
const (
	logKeyJob    = "job"    // the job ID
	logKeyWorker = "worker" // the launch index (0 with -worker)
	logKeyPID    = "pid"    // the process ID
)

// logLevel returns the -log-level, or its default: info for a -worker (on
// a pod the log is the only output), warn under the launcher (which prints
// progress lines of its own).
func logLevel(c *config) (slog.Level, error) {
	switch c.logLevel {
	case "":
		if c.worker {
			return slog.LevelInfo, nil
		}
		return slog.LevelWarn, nil
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("-log-level %q: want debug, info, warn or error", c.logLevel)
}

// newLogger returns the worker's logger: log/slog's text or JSON handler
// (-log-format) on w at -log-level, every record carrying the job ID, the
// worker's launch index and its PID.
func newLogger(c *config, w io.Writer) *slog.Logger {
	level, _ := logLevel(c) // validated by parseFlags
	// Durations as "1.5s" in JSON too, not integers of nanoseconds.
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: launch.ReplaceDurations}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if c.logFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(h).With(logKeyJob, c.job, logKeyWorker, workerIndex(), logKeyPID, os.Getpid())
}
