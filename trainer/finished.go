package trainer

import "fmt"

// finishedBeforeJoin is Run's error when the rendezvous answers that the
// job is finished and this Run has not trained a step: the store remembers
// the job ID as finished (Elastic.StateTTL long), from an earlier run of it
// or from the others having finished it before this worker joined. It
// wraps err (elastic.ErrJobFinished), so callers test it with errors.Is.
func (t *Trainer[B]) finishedBeforeJoin(err error) error {
	t.log.Error("the job had already finished when this worker joined; nothing was trained",
		"job", t.cfg.JobID, "hint", "use a new job ID to train again")
	return fmt.Errorf("trainer: job %q had already finished when this worker joined, and this worker trained no step (a new job ID trains again): %w",
		t.cfg.JobID, err)
}
