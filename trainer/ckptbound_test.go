package trainer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
)

// slowStore is a CheckpointStore over a LocalDir whose Save first takes
// delay (forever when delay is negative: a store that hangs, an NFS mount
// gone, an object store that never answers), or until its context ends,
// whichever is first. The first Save call is announced on entered.
type slowStore struct {
	*LocalDir
	delay   time.Duration
	entered chan int64
}

func newSlowStore(t *testing.T, delay time.Duration) *slowStore {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	return &slowStore{LocalDir: dir, delay: delay, entered: make(chan int64, 1)}
}

func (s *slowStore) Save(ctx context.Context, step int64, data []byte) error {
	select {
	case s.entered <- step:
	default:
	}
	var slow <-chan time.Time // nil: never
	if s.delay >= 0 {
		tm := time.NewTimer(s.delay)
		defer tm.Stop()
		slow = tm.C
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("slow store: step %d: %w", step, ctx.Err())
	case <-slow:
	}
	return s.LocalDir.Save(ctx, step, data)
}

// endSlack is what Run's end may add past the bound of a checkpoint
// write: close's wait for a cancelled Save (CkptAbandonAfter) and one
// leave call (5 s, trainer.go), the only waits on that path.
const endSlack = CkptAbandonAfter + 5*time.Second

// reform is how long the job's worker takes to form its next round after
// one failed: the last call (300 ms, loop_test.go's config) and a
// heartbeat (100 ms).
const reform = 300*time.Millisecond + 100*time.Millisecond

// waitRun waits for w's Run to return within bound, counted from since.
func waitRun(t *testing.T, w *inproc, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(bound - time.Since(since)):
		w.cancel()
		t.Fatalf("Run did not return within %v", bound)
	}
	return time.Since(since)
}

// A preempted worker whose asynchronous checkpoint write hangs returns
// within its grace period (plus the end's own bounded waits), with an
// error wrapping ErrCheckpoint that names the step not written and how
// long it was waited for, instead of outliving the grace period in
// ck.close and being killed with nothing said (issue 29).
func TestPreemptedWorkerWithAHungCheckpointStoreReturnsWithinTheGracePeriod(t *testing.T) {
	store := newSlowStore(t, -1)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 100 // the job cannot finish before the preemption
	grace := time.Second
	j.mutate = func(c *Config) { c.CheckpointEvery, c.GracePeriod = 2, grace } // CheckpointTimeout: default 10 min
	var logs bytes.Buffer                                                      // written under the handler's lock, read once Run returned
	j.opts = func(int) []Option {
		return []Option{WithCheckpointStore(store), WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}
	}
	w := j.start()
	step := <-store.entered
	preempted := time.Now()
	w.tr.Preempt()
	took := waitRun(t, w, preempted, grace+endSlack)
	require.ErrorIs(t, w.err, ErrPreempted)
	require.ErrorIs(t, w.err, ErrCheckpoint)
	require.ErrorContains(t, w.err, fmt.Sprintf("the checkpoint of step %d was not written", step))
	require.ErrorContains(t, w.err, "Run's end waited")
	require.ErrorContains(t, w.err, "grace period of 1s exceeded")
	require.GreaterOrEqual(t, took, grace, "the write was waited for up to the grace period")
	j.wait()
	require.Contains(t, logs.String(), fmt.Sprintf(`level=WARN msg="checkpoint write cancelled at the end of Run: not written" step=%d`, step))
}

// A worker whose Run ends for another reason (here its ctx) while an
// asynchronous write hangs returns within Config.CheckpointTimeout of the
// write's start, with ErrCheckpoint naming the step.
func TestHungAsynchronousCheckpointIsBoundedByCheckpointTimeout(t *testing.T) {
	store := newSlowStore(t, -1)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 100
	bound := time.Second
	j.mutate = func(c *Config) { c.CheckpointEvery, c.CheckpointTimeout = 2, bound }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(store)} }
	w := j.start()
	step := <-store.entered
	began := time.Now()
	w.cancel()
	waitRun(t, w, began, bound+endSlack)
	require.ErrorIs(t, w.err, context.Canceled)
	require.ErrorIs(t, w.err, ErrCheckpoint)
	require.ErrorContains(t, w.err, fmt.Sprintf("the checkpoint of step %d was not written", step))
	require.ErrorContains(t, w.err, "not written within CheckpointTimeout (1s)")
	j.wait()
}

// The final, synchronous checkpoint of a job on a store that hangs is
// bounded by Config.CheckpointTimeout too: Run returns ErrCheckpoint with
// the job finished, instead of never returning.
func TestHungFinalCheckpointIsBoundedByCheckpointTimeout(t *testing.T) {
	store := newSlowStore(t, -1)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	bound := time.Second
	j.mutate = func(c *Config) { c.CheckpointTimeout = bound } // CheckpointEvery 0: only the final one
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(store)} }
	w := j.start()
	<-store.entered
	waitRun(t, w, time.Now(), bound+endSlack)
	require.ErrorIs(t, w.err, ErrCheckpoint)
	require.ErrorContains(t, w.err, "not written within CheckpointTimeout (1s)")
	require.True(t, w.res.Finished)
	j.wait()
}

// A slow write that finishes within its bound is waited for at Run's end
// and kept, whether Run's ctx ended or the worker was preempted: the bound
// never turns a checkpoint that could be written into a lost one.
func TestSlowCheckpointWithinItsBoundIsKeptAtRunsEnd(t *testing.T) {
	for _, how := range []string{"cancelled", "preempted"} {
		t.Run(how, func(t *testing.T) {
			store := newSlowStore(t, 300*time.Millisecond) // well within GracePeriod and CheckpointTimeout
			j := newJob(t, stores(t)["memory"])
			j.epochs = 100
			j.mutate = func(c *Config) { c.CheckpointEvery = 2 }
			j.opts = func(int) []Option { return []Option{WithCheckpointStore(store)} }
			w := j.start()
			step := <-store.entered
			if how == "cancelled" {
				w.cancel()
			} else {
				w.tr.Preempt()
			}
			j.wait()
			require.False(t, errors.Is(w.err, ErrCheckpoint), "%v", w.err)
			steps, err := store.List(context.Background())
			require.NoError(t, err)
			require.True(t, slices.Contains(steps, step), "step %d's checkpoint in %v", step, steps)
			if how == "preempted" {
				require.ErrorIs(t, w.err, ErrPreempted)
				require.Equal(t, w.res.Step, steps[0], "the preempted step's checkpoint is the newest")
			} else {
				require.ErrorIs(t, w.err, context.Canceled)
			}
		})
	}
}

// hungListStore is a CheckpointStore over a LocalDir whose List hangs
// until its context ends (a store that never answers).
type hungListStore struct{ *LocalDir }

func (s hungListStore) List(ctx context.Context) ([]int64, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("hung store: list: %w", ctx.Err())
}

// A List at a round's start that hangs is bounded by CheckpointTimeout and
// is an error (the round fails, and the budget ends the job), not "no
// checkpoint" (which would start the job over) nor a hang.
func TestHungCheckpointListIsBoundedAndNotTakenForNoCheckpoint(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["memory"])
	bound := time.Second
	j.mutate = func(c *Config) { c.CheckpointTimeout, c.MaxRecoveries = bound, 1 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(hungListStore{dir})} }
	start := time.Now()
	w := j.start()
	// Two rounds (MaxRecoveries 1), each with one List, and between them
	// the pause after an unformed round (at most 1 s) and the re-form.
	waitRun(t, w, start, 2*bound+time.Second+reform+endSlack)
	require.ErrorIs(t, w.err, ErrFailureBudget)
	require.ErrorContains(t, w.err, "listing the checkpoints: not done within CheckpointTimeout (1s)")
	require.Zero(t, w.res.Step, "nothing trained from a fresh start")
	j.wait()
}

// hungPart is a Partition whose Checkpoint hangs until its context ends
// (shards on a disk that never answers); the rest does nothing.
type hungPart struct{ checkpoints chan int64 }

func (hungPart) Name() string                                  { return "hung" }
func (hungPart) Listen(context.Context) (string, error)        { return "", nil }
func (hungPart) Restore(context.Context, PartitionRound) error { return nil }
func (hungPart) Commit(context.Context, int64) error           { return nil }
func (hungPart) EndRound(context.Context) error                { return nil }
func (hungPart) Close() error                                  { return nil }
func (p hungPart) Checkpoint(ctx context.Context, step int64) ([]byte, error) {
	select {
	case p.checkpoints <- step:
	default:
	}
	<-ctx.Done()
	return nil, fmt.Errorf("hung partition: step %d: %w", step, ctx.Err())
}

// A partition's checkpoint that hangs is bounded by CheckpointTimeout like
// a store call: the round fails with ErrCheckpoint naming the partition and
// the step, and the budget ends the job, instead of the worker hanging.
func TestHungPartitionCheckpointIsBoundedByCheckpointTimeout(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	bound := time.Second
	j.mutate = func(c *Config) { c.CheckpointTimeout, c.MaxRecoveries = bound, 1 }
	part := hungPart{checkpoints: make(chan int64, 1)}
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(dir), WithPartition(part)} }
	w := j.start()
	step := <-part.checkpoints
	// Two rounds (MaxRecoveries 1), each ending in the final checkpoint,
	// and between them the re-form and the state transfer (well within
	// a second here: one worker, a memory store).
	waitRun(t, w, time.Now(), 2*bound+time.Second+reform+endSlack)
	require.ErrorIs(t, w.err, ErrFailureBudget)
	require.ErrorContains(t, w.err, fmt.Sprintf(`partition "hung": checkpoint of step %d: not done within CheckpointTimeout (1s)`, step))
	j.wait()
}
