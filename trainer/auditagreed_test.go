package trainer_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// deadAtAgreement is a Recorder through which rank 0 of round 2 dies as
// it records the round's agreement: the record never reaches the log and
// that rank goes no further (its Run fails), as a SIGKILL there leaves it.
type deadAtAgreement struct {
	audit.Recorder
	died atomic.Bool
}

var errDiedRecording = errors.New("rank 0 died recording the agreement")

func (d *deadAtAgreement) RecordAgreed(e audit.Entry) error {
	if e.Round == 2 && e.Rank == 0 && !e.Ended && d.died.CompareAndSwap(false, true) {
		return errDiedRecording
	}
	return d.Recorder.RecordAgreed(e)
}

// The helper that tried to break the audit found false duplicates: a
// round's agreement was recorded by rank 0 alone, after the round's first
// exchange, so when rank 0 died right after that exchange the other ranks
// applied the step with no agreement in the log, and the records of the
// same step from the round before were never dropped. Here step 26 is
// recorded in round 1 and not applied (a rank fails right after its
// allreduce, so the round ends and the next goes on from commit 25), then
// rank 0 of round 2 dies as it records that round's agreement while its
// peers apply step 26. Every rank records the agreement now, and the audit
// of the survivors' job is exact.
func TestAnAgreementSurvivesRankZerosDeathAfterTheFirstExchange(t *testing.T) {
	j := newMemJob(t, 640, 8, 3)
	j.cfg.Elastic.MinWorkers = 2
	rec := &deadAtAgreement{Recorder: j.audit}
	j.opts = func(*trainertest.Worker) []Option { return []Option{WithAudit(rec)} }
	var failed atomic.Bool
	j.afterReduce = func(rank int, step int64) error {
		if rank == 2 && step == 26 && failed.CompareAndSwap(false, true) {
			return errors.New("injected failure after the allreduce")
		}
		return nil
	}
	ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
	j.c.Wait()
	require.True(t, failed.Load(), "step 26 failed in round 1")
	require.True(t, rec.died.Load(), "rank 0 of round 2 died at its agreement")

	var finishers []*trainertest.Worker
	for _, w := range ws {
		if _, err := w.Result(); errors.Is(err, errDiedRecording) {
			continue
		}
		finishers = append(finishers, w)
	}
	require.Len(t, finishers, 2, "the two others finish")
	var round2 []audit.Entry
	for _, e := range j.audit.Entries() {
		if e.Kind == "agreed" && e.Round == 2 {
			round2 = append(round2, e)
		}
	}
	require.NotEmpty(t, round2, "round 2's agreement is in the log without rank 0's record")
	for _, e := range round2 {
		require.NotZero(t, e.Rank)
		require.EqualValues(t, 25, e.Step)
	}
	j.check(finishers)
}
