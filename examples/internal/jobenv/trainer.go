package jobenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	gosync "sync"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
)

// TrainerHooks returns hooks that report a worker's rounds (on every rank)
// and steps (on rank 0) to the launcher through ev, as its summary of the
// job expects them.
func TrainerHooks(ev *launch.Emitter) trainer.Hooks {
	return trainer.Hooks{
		OnRound: func(r trainer.RoundInfo) {
			ev.Emit(launch.Event{Ev: launch.EvRound, Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step,
				Epoch: r.Epoch, Source: r.Source, Recovery: r.Recovery, RolledBack: r.RolledBack})
		},
		OnStep: func(s trainer.StepInfo) {
			if s.Rank == 0 {
				ev.Emit(launch.Event{Ev: launch.EvStep, Round: s.Round, Rank: 0, WorldSize: s.WorldSize, Step: s.Step,
					Epoch: s.Epoch, Loss: s.Loss, Samples: s.Samples, RecoverySeconds: s.RecoverySeconds})
			}
			monitor.HoldAtStep()
		},
	}
}

// PendingStore is a store.Redis that tells the launcher (launch.EvPending,
// once) when the worker first waits in the store to be taken into the
// job's next round; launch/monitor holds the job for a Join fault's
// newcomer until then. It embeds the store.Redis, so the Agent still finds
// its optional capabilities.
type PendingStore struct {
	*store.Redis
	ev   *launch.Emitter
	once gosync.Once
}

// NewPendingStore returns the job's Redis store on c (store.NewRedis),
// reporting to ev.
func NewPendingStore(c redis.UniversalClient, ev *launch.Emitter) *PendingStore {
	return &PendingStore{Redis: store.NewRedis(c), ev: ev}
}

// Join is Redis.Join, and sends launch.EvPending the first time it
// answers RolePending.
func (s *PendingStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	v, err := s.Redis.Join(ctx, r)
	if err == nil && v.Role == store.RolePending {
		s.once.Do(func() { s.ev.Emit(launch.Event{Ev: launch.EvPending}) })
	}
	return v, err
}

// PreemptOnSIGTERM calls preempt (a Trainer's Preempt) when the process
// gets SIGTERM, until stop is called; stop waits for its goroutine.
func PreemptOnSIGTERM(preempt func()) (stop func()) {
	sigs, quit, done := make(chan os.Signal, 1), make(chan struct{}), make(chan struct{})
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		defer close(done)
		select {
		case <-sigs:
			preempt()
		case <-quit:
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(quit)
		<-done
	}
}

// VerifyAuditFile replays the audit log a job's workers wrote to path
// (audit.File) with audit.Verify.
func VerifyAuditFile(path string, epochs int, expected func(epoch int) []int) (audit.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return audit.Report{}, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	entries, err := audit.ReadLog(f)
	if err != nil {
		return audit.Report{}, err
	}
	return audit.Verify(entries, epochs, expected), nil
}

// Fail returns the error handler of a worker of the program name: it
// reports err to the launcher (an "error" event) and on w, and returns the
// worker's exit status: launch.StatusPermanent for an error a restart
// cannot fix (launch.Permanent: the launcher then restarts nothing and
// stops the job), launch.StatusRefused for a worker the job refused (not
// restarted; the job goes on), else 1.
func Fail(ev *launch.Emitter, w io.Writer, name string) func(err error) int {
	return func(err error) int {
		ev.Emit(ErrorEvent(err))
		fmt.Fprintf(w, "%s worker %d: %v\n", name, os.Getpid(), err)
		if s := launch.ExitStatus(err); s == launch.StatusPermanent || s == launch.StatusRefused {
			return s
		}
		return 1
	}
}

// ErrorEvent is the launch.EvError a worker sends for err before it exits:
// its message, marked Checkpoint when err wraps trainer.ErrCheckpoint (the
// monitor then does not call the job clean). It lives here, beside the
// other trainer-side glue of the examples, because package launch must not
// import trainer.
func ErrorEvent(err error) launch.Event {
	return launch.Event{Ev: launch.EvError, Message: err.Error(), Checkpoint: errors.Is(err, trainer.ErrCheckpoint)}
}
