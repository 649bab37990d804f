package trainer

import "fmt"

// finishedBeforeJoin is Run's error when the rendezvous answers that the
// job is finished and this Run has not trained a step: the store remembers
// the job ID as finished (Elastic.StateTTL long), from an earlier run of it
// or from the others having finished it before this worker joined. It
// wraps err (elastic.ErrJobFinished), so callers test it with errors.Is.
func (t *Trainer[B]) finishedBeforeJoin(err error) error {
	// No job attribute: the logger is the caller's (WithLogger), and one
	// that needs the job carries it already.
	t.log.Error("the job had already finished when this worker joined; nothing was trained",
		"hint", "use a new job ID to train again")
	return fmt.Errorf("trainer: job %q had already finished when this worker joined, and this worker trained no step (a new job ID trains again): %w",
		t.cfg.JobID, err)
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
