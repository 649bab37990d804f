// Package faultinject is the fault-injection harness of elastictrain's
// reliability suite: it runs real worker processes of a small deterministic
// training job against real Redis, injects every fault a job on preemptible
// machines meets, and checks the SDK's invariants after every run (exactly
// once, no hang, identical parameters, a readable checkpoint: see run.go).
// It is internal: tests use it, users do not.
//
// # Where the parts live
//
// The harness, its worker program, the fault injection and the invariant
// checks (harness_test.go, worker_test.go, inject_test.go, run_test.go,
// stats_test.go) import the trainer, elastic, dataloader and launch, so
// they live in this package's test files: `go test ./internal/faultinject`
// builds them into the test binary (the worker is that binary re-executed),
// and no production package can import them. The package proper is what
// other packages' tests use too, with the standard library only beneath it:
// Proxy, and the fault kinds and random Schedule.
//
// # Worker processes
//
// A worker is the test binary re-executed with EnvWorker set: its TestMain
// calls WorkerMain, which trains the linear-regression job of package
// trainer/trainertest (a few milliseconds per step) with a audit.File
// shared by all workers, durable checkpoints in a shared directory, and the
// timings of WorkerConfig. It reports its rounds, steps and end as
// launch.Events on the launcher's events pipe (read back as Reports) and
// logs JSON on standard error; the job secret travels in the environment
// only. Every worker process is a launch.Job of its own (one worker, no
// restarts, no store of launch's: launch.Config.NoStore), so starting,
// signalling, reaping and placing it on a host (launch.Spec.Wrap) is
// launch's, while the faults, the invariant checks and the audits are the
// harness's.
//
// # Harness
//
// Start launches the workers of one job (Config); AddWorker starts more;
// Signal sends SIGKILL, SIGSTOP, SIGCONT or SIGTERM; WaitFor and WaitStep
// wait on the reports with a deadline. With Config.ProxyRedis each worker
// reaches Redis through its own Proxy; with Config.ProxyPeers each worker's
// collective port sits behind a Proxy (the worker advertises the proxy's
// address through sync.Config.AdvertiseAddr, with Unix sockets and shared
// memory off so every byte between ranks crosses it). Config.Redis (a
// *testredis.Server) lets the harness stop and restart Redis. With
// Config.RedisSentinels and RedisMaster the workers reach Redis through
// go-redis' failover client (a testredis.SentinelSet's Sentinels), so a
// test can kill the master and watch the job follow the failover.
//
// # Faults
//
// Kind lists them: SIGKILL, hang (SIGSTOP then SIGCONT), preemption
// (SIGTERM), a new worker, a new worker killed while it joins (registering,
// pending, or holding a rank its peers are still connecting to), a
// whole-job crash, Redis restarted empty, Redis
// stopped for a while, and latency, bandwidth limits, blackholes and cuts on
// one worker's Redis link or on the links into its collective port.
// NewSchedule draws a schedule from a seed (math/rand/v2 PCG), so a failing
// run replays with the same seed; Inject applies one fault and heals it.
//
// # Invariants
//
// Run drives one job through a schedule and Finish checks, once every
// process has exited: the job finished within its bounds and nothing stayed
// blocked (each fault is followed by a step within Bounds.Recover, the end
// by every exit within Bounds.Exit); no process is left; every exit is one
// the faults explain and no log holds a panic, a data race or the secret;
// the audit shows every sample of every epoch exactly once; every rank that
// finished holds identical parameters and optimizer state (SHA-256); every
// durable checkpoint loads, and a fresh worker of a new job, told to train
// one epoch more, restores the newest one to the same state and trains on. Violations come back as sentences in RunResult.
//
// # Statistics
//
// Stats folds runs together: faults injected, survived and disrupting by
// kind, invariant violations, and recovery times (from a fault's start, and
// after it healed, to the first step applied in a new round), with median
// and maximum. The soak test prints them.
//
// # Proxy
//
// Proxy is a small TCP proxy (no third-party dependency) whose faults can
// change at any moment: SetLatency, SetBandwidth, SetBlackhole, Cut and
// SetRefuse; SetCapture keeps the first bytes of each connection, which the
// security tests replay.
package faultinject
