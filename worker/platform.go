package worker

import "context"

// Platform enacts scaling decisions and says how many workers the platform
// allows. The policy (trainer/autoscale) never starts or stops a process
// itself: it decides, and a Platform carries the decision out. Package
// launch implements it for local worker processes (a client of the
// launcher's control socket); a Kubernetes implementation scales the Job.
//
// Who calls what:
//
//   - Capacity: every rank, at most once per decision interval, from the
//     goroutine that runs the training loop. It must return within ctx.
//   - Resize: rank 0 only, once for each decision that changes the target
//     world size. Growing starts target minus current workers, which join
//     the running job at a step boundary; shrinking is done by the named
//     workers themselves (Release, then a graceful leave), so an
//     implementation that cannot choose whom to stop may ignore a lower
//     target. Calling it again with the same target is harmless.
//   - Release: called by a worker that a decision names for removal, on
//     itself, just before it commits and leaves gracefully; the platform
//     must not replace it.
//
// Methods return an error when the platform cannot be reached or refuses;
// the trainer logs it and goes on training at the current size (a failed
// enactment never stops a job). Implementations are safe for concurrent
// use.
type Platform interface {
	// Capacity returns how many workers the platform allows the job now.
	// ok is false when the platform states no bound (the job's
	// MaxWorkers then bounds the size alone).
	Capacity(ctx context.Context) (n int, ok bool, err error)
	// Resize asks the platform to run target workers in all (target >= 1).
	Resize(ctx context.Context, target int) error
	// Release tells the platform that the calling worker leaves the job by
	// decision and is not to be replaced.
	Release(ctx context.Context) error
}
