// Package worker is what a training worker and the platform that runs it
// share, with only the standard library beneath it, so that neither knows
// the other's types: package trainer (the worker's loop) and package launch
// (the local process supervisor; a Kubernetes platform likewise) both
// import it, and neither imports the other.
//
// # Errors
//
// The sentinel errors here are the trainer's outcomes that decide a worker
// process's exit status (launch.ExitStatus): a graceful leave (ErrPreempted,
// ErrReleased), a lost checkpoint (ErrCheckpoint), errors that a restart
// cannot fix (ErrInvalidConfig, ErrForeignCheckpoint, ErrFinishedCheckpoint,
// ErrSettingsMismatch, ErrModelMismatch, ErrShapeMismatch) and a worker that
// the job's members refused (ErrRefused). Package trainer exports each one
// under the same name (trainer.ErrPreempted is worker.ErrPreempted), and its
// documentation there says when Run returns it; test either with errors.Is.
// Their messages start with "trainer:", the package that returns them.
//
// # Platform
//
// Platform is what enacts the trainer's scaling decisions
// (trainer/autoscale): package launch implements it for local processes
// (launch.Worker.Platform), package kubernetes/jobscale for a Kubernetes Job.
//
// # Settings
//
// Settings is the job's part of a worker's configuration that its launcher
// hands it (job ID, secret, grace period, platform); a Configurable (such as
// *trainer.Config) takes them: launch.Worker.Configure(&cfg).
package worker
