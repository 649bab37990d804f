package trainer

import (
	"fmt"
)

// checkpointWhere is " in DIR" for a CheckpointStore with a directory
// (LocalDir), or "".
func (t *Trainer[B]) checkpointWhere() string {
	if d, ok := t.o.ckpt.(interface{ Dir() string }); ok {
		return " in " + d.Dir()
	}
	return ""
}

// finishedCheckpoint is rank 0's error for a checkpoint of step that
// completes every epoch of this job.
func (t *Trainer[B]) finishedCheckpoint(step int64, epoch int64) error {
	return fmt.Errorf("%w: the checkpoint of step %d%s is at the end of epoch %d, and this job trains %d epochs: "+
		"nothing is left to train; refusing to start so that nothing in it is changed "+
		"(raise the epochs to train more from it, or use an empty directory for a new job)",
		ErrFinishedCheckpoint, step, t.checkpointWhere(), epoch, t.cfg.Epochs)
}

// finishedBeforeJoin is Run's error when the rendezvous answers that the
// job is finished and this Run has not trained a step: the store remembers
// the job ID as finished (Elastic.StateTTL long), from an earlier run of it
// or from the others having finished it before this worker joined. It
// wraps err (elastic.ErrJobFinished), so callers test it with errors.Is.
func (t *Trainer[B]) finishedBeforeJoin(err error) error {
	// No job attribute: the logger is the caller's (WithLogger), and one
	// that needs the job carries it already.
	hint := "a new job ID trains again"
	if t.o.ckpt != nil {
		// Under a new job ID the finished job's final checkpoint is
		// restored (a whole-job restart), and refused when it completes
		// the epochs (ErrFinishedCheckpoint).
		where := t.checkpointWhere()
		if where == "" {
			where = " in the checkpoint store"
		}
		hint += "; the finished job's checkpoints are" + where + ": more epochs train on from them, an empty directory starts over"
	}
	t.log.Error("the job had already finished when this worker joined; nothing was trained", "hint", hint)
	return fmt.Errorf("trainer: job %q had already finished when this worker joined, and this worker trained no step (%s): %w",
		t.cfg.JobID, hint, err)
}

// finishedWithout is Run's error for a worker that trained but finds the
// job finished by the others before its own loader reached the last epoch
// (it was paused, fenced or cut off at the end): its parameters are those of
// step t.step, not the job's final model, so success would mislead a
// caller that saves them.
func (t *Trainer[B]) finishedWithout(err error) error {
	t.log.Error("the job finished without this worker; its parameters are not the final model",
		"step", t.step, "epoch", t.epoch, "epochs", t.cfg.Epochs)
	return fmt.Errorf("trainer: job %q finished without this worker, whose parameters are those of step %d (epoch %d of %d), not the final model: %w",
		t.cfg.JobID, t.step, t.epoch, t.cfg.Epochs, err)
}
