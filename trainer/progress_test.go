package trainer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// logSpy is a slog.Handler that keeps every record's message.
type logSpy struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logSpy) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSpy) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.msgs = append(h.msgs, b.String())
	return nil
}
func (h *logSpy) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSpy) WithGroup(string) slog.Handler      { return h }
func (h *logSpy) has(sub string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// TestHungStepFunctionIsLeftBehind (issue 14, Must show 2): one worker's
// step function blocks (it ignores its context: a true hang) while its
// process and heartbeats live on. Within ProgressTimeout + 1 s of the hang
// the other two train in a round without it; when it wakes it is fenced,
// rejoins as a new member, and the job still trains every sample exactly
// once with identical parameters on every rank.
func TestHungStepFunctionIsLeftBehind(t *testing.T) {
	j := newMemJob(t, 1600, 8, 2)
	j.cfg.Elastic.MinWorkers = 2
	j.cfg.Elastic.ProgressTimeout = time.Second
	release := make(chan struct{})
	var victim atomic.Pointer[trainertest.Worker]
	var hungAt atomic.Int64
	j.step = func(w *trainertest.Worker, f StepFunc[trainertest.Batch]) StepFunc[trainertest.Batch] {
		return func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			if victim.Load() == w && hungAt.CompareAndSwap(0, time.Now().UnixNano()) {
				<-release
			}
			return f(ctx, b)
		}
	}
	spy := &logSpy{}
	j.opts = func(w *trainertest.Worker) []Option {
		if w.Index == 1 {
			return []Option{WithLogger(slog.New(spy))}
		}
		return nil
	}
	ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
	j.waitStep(20)
	victim.Store(ws[1])
	deadline := time.After(30 * time.Second)
	var took time.Duration
wait:
	for {
		select {
		case s := <-j.steps:
			if at := hungAt.Load(); at != 0 && s.WorldSize == 2 {
				took = time.Since(time.Unix(0, at))
				break wait
			}
		case <-deadline:
			t.Fatal("no step without the hung worker")
		}
	}
	t.Logf("the others train without the hung worker %v after its step blocked (bound %v)",
		took, j.cfg.Elastic.ProgressTimeout+time.Second)
	require.Less(t, took, j.cfg.Elastic.ProgressTimeout+time.Second, "within ProgressTimeout + 1 s")
	close(release)
	j.c.Wait()
	require.True(t, spy.has("fenced; rejoining as a new member"), "the hung worker was fenced when it woke")
	require.True(t, spy.has("no progress"), "the hung worker's fence names the cause")
	j.check(ws)
}
