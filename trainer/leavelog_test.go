package trainer_test

import (
	"log/slog"
	"strings"
	stdsync "sync"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
)

// A peer preempted gracefully (it committed with the others and left by
// agreement) is logged by the survivors once, at INFO, as having left,
// naming its member ID, not as a WARN "gone (evicted: crashed, hung, left,
// or reported)".
func TestAGracefulLeaveIsLoggedAsOne(t *testing.T) {
	type line struct {
		level slog.Level
		msg   string
		gone  string
	}
	var mu stdsync.Mutex
	lines := map[int][]line{}
	j := newJob(t, stores(t)["redis"])
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.opts = func(idx int) []Option {
		return []Option{WithLogger(slog.New(&recordHandler{min: slog.LevelInfo, rec: func(r slog.Record) {
			if !strings.Contains(r.Message, "member of the last round") {
				return
			}
			l := line{level: r.Level, msg: r.Message}
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "gone_member" {
					l.gone = a.Value.String()
				}
				return true
			})
			mu.Lock()
			lines[idx] = append(lines[idx], l)
			mu.Unlock()
		}}))}
	}
	a, b, c := j.start(), j.start(), j.start()
	b.waitStep(t, 5)
	b.tr.Preempt()
	j.wait()
	require.ErrorIs(t, b.err, ErrPreempted)
	j.checkFinished([]*inproc{a, c})
	mu.Lock()
	defer mu.Unlock()
	for _, w := range []*inproc{a, c} {
		var left int
		for _, l := range lines[w.idx] {
			require.NotEqual(t, slog.LevelWarn, l.level, "worker %d: %q about %s", w.idx, l.msg, l.gone)
			if l.gone != "" && strings.Contains(l.msg, "left gracefully") {
				left++
			}
		}
		require.Equal(t, 1, left, "worker %d logs the graceful leave once: %v", w.idx, lines[w.idx])
	}
}
