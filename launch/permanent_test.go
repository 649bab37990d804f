package launch

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/trainer"
)

// The errors a restart cannot fix map to StatusPermanent, wrapped or not;
// the others keep their status; a launcher's error of a job stopped for
// one is StatusUsage.
func TestExitStatusOfPermanentErrors(t *testing.T) {
	for _, err := range []error{
		trainer.ErrInvalidConfig, elastic.ErrInvalidConfig, trainer.ErrForeignCheckpoint, trainer.ErrFinishedCheckpoint,
		trainer.ErrSettingsMismatch, trainer.ErrModelMismatch, trainer.ErrShapeMismatch,
		&trainer.SettingsError{Round: 3, Diffs: []trainer.SettingDiff{{Setting: "learning rate"}}},
	} {
		wrapped := fmt.Errorf("worker: %w", err)
		require.True(t, Permanent(wrapped), "%v", err)
		require.Equal(t, StatusPermanent, ExitStatus(wrapped), "%v", err)
	}
	// A worker the running members refused: not restarted either, but it
	// does not stop the job (StatusRefused).
	refused := fmt.Errorf("worker: %w", &trainer.SettingsError{Round: 3, Refused: []string{"m"}, Diffs: []trainer.SettingDiff{{Setting: "learning rate"}}})
	require.True(t, Refused(refused))
	require.Equal(t, StatusRefused, ExitStatus(refused))
	for err, want := range map[error]int{
		trainer.ErrPreempted: StatusPreempted, elastic.ErrJobFinished: StatusJobFinished, trainer.ErrStepFailed: StatusFailed,
		trainer.ErrFailureBudget: StatusFailed, trainer.ErrStranger: StatusFailed, trainer.ErrDiverged: StatusFailed,
		errors.Join(ErrFailed, ErrPermanent): StatusUsage, ErrInvalidConfig: StatusUsage,
	} {
		require.False(t, Permanent(err) && want != StatusUsage, "%v", err)
		require.Equal(t, want, ExitStatus(err), "%v", err)
	}
}

// A Go panic (status 2) is a crash: restarted unless it came at the first
// start of its index within the start-up window; StatusPermanent never
// is, whenever it comes.
func TestAPanicIsRestartedAndAPermanentErrorIsNot(t *testing.T) {
	window := 3 * time.Second
	panicLate := Exit{Process: Process{PID: 9}, Code: 2, Outcome: Failed, Ran: time.Minute}
	_, usage, why := startFailure(panicLate, nil, window)
	require.False(t, usage)
	require.Empty(t, why, "a panic after the start-up window is restarted like a crash")
	panicAtStart := panicLate
	panicAtStart.Ran = time.Second
	_, usage, why = startFailure(panicAtStart, nil, window)
	require.True(t, usage, "status 2 at a first start reads as a refused command line")
	require.NotEmpty(t, why)

	require.Equal(t, Failed, classify(StatusPermanent, 0))
	require.Equal(t, Failed, jobOutcome([]Exit{{Outcome: Failed, Code: StatusPermanent, Permanent: true},
		{Outcome: Preempted, Code: 143, AtStop: true}}, true), "the others left on the stop, the job failed")
	require.Equal(t, Failed, classify(-1, syscall.SIGKILL))
}
