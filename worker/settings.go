package worker

import "time"

// Settings is the job's part of a worker's configuration, as the platform
// that started the worker knows it (launch.Worker.Configure builds it from
// the launcher's environment). Everything else (world size bounds, epochs,
// checkpoints) stays the worker's own.
type Settings struct {
	// JobID is the job's ID; empty leaves the worker's own.
	JobID string
	// Secret is the job secret that the sync transport authenticates peers
	// with (a copy the receiver may keep); nil leaves the worker's own.
	Secret []byte
	// GracePeriod bounds the worker's graceful leave so that it ends
	// before the platform kills the process; a worker whose own grace
	// period is unset (<= 0) or longer takes this one. 0: no bound.
	GracePeriod time.Duration
	// Platform enacts the worker's scaling decisions; nil leaves the
	// worker's own.
	Platform Platform
	// Autoscale, when true, turns the worker's scaling policy on (its
	// knobs stay the worker's); false leaves the worker's choice.
	Autoscale bool
	// ShareCores, when > 0, is how many workers share this host's cores;
	// a worker whose own is unset (0) takes it.
	ShareCores int
}

// Configurable is a worker's configuration that takes the job's Settings,
// with the rules that Settings' fields state. *trainer.Config implements
// it; launch.Worker.Configure takes one.
type Configurable interface {
	ConfigureJob(s Settings)
}
