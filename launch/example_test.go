package launch_test

import (
	"context"
	"fmt"
	"os"

	"github.com/elastictrain/elastictrain/launch"
)

// Run starts the workers (here a shell command standing in for a worker
// binary), hosts an embedded store for them, and returns the job's result
// once every worker exited.
func ExampleRun() {
	cfg := launch.DefaultConfig()
	cfg.Workers, cfg.JobID = 1, "example-job"
	res, err := launch.Run(context.Background(), launch.Spec{
		Command: []string{"sh", "-c", `echo "worker $ELASTICTRAIN_WORKER of job $ELASTICTRAIN_JOB_ID"`},
		Stdout:  os.Stdout,
	}, cfg)
	fmt.Println(res.Outcome, launch.ExitStatus(err))
	// Output:
	// worker 0 of job example-job
	// finished 0
}

// A worker reads what its launcher told it with WorkerEnv; outside a
// launcher it gets ErrNotLaunched.
func ExampleWorkerEnv() {
	os.Unsetenv(launch.EnvJobID)
	_, err := launch.WorkerEnv()
	fmt.Println(err)
	// Output:
	// launch: not started by a launcher (ELASTICTRAIN_JOB_ID is not set)
}
