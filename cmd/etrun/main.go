// Command etrun runs N worker processes of your own binary as one elastic
// job on this host, like torchrun: an embedded Redis-protocol store for
// their rendezvous (or -redis ADDR), the job ID and secret in their
// environment, crashed workers restarted up to -max-restarts, SIGTERM and
// SIGINT forwarded to every worker with a grace period, and the job's exit
// status as its own. It is a thin command over package launch.
//
//	etrun -workers 4 ./my-worker -epochs 3
//	etrun -workers 2 -redis 127.0.0.1:6379 -job my-job -- ./my-worker
//
// Everything after the flags (or after --) is the worker's command. The
// workers read the job through launch.WorkerEnv (ELASTICTRAIN_STORE,
// ELASTICTRAIN_JOB_ID, ELASTICTRAIN_SECRET, ELASTICTRAIN_WORKER, ...). The
// secret is ELASTICTRAIN_SECRET from etrun's own environment when set (hex,
// at least 16 bytes: launchers on several hosts share one job), else drawn
// at random. A first SIGTERM or SIGINT is forwarded to every worker and
// what is left after -grace is SIGKILLed; a second one SIGKILLs them at
// once.
//
// Once the job finished (a worker exited 0), the other workers get -grace
// to exit; one still running then is hung or stopped and is SIGKILLed, so
// etrun never waits for it forever.
//
// A worker that fails within -startup-window of its start is not
// restarted when a restart would fail the same way: status 2 on its first
// start (its command line was refused: Go's flag package exits 2, so does
// a Go panic), or the same status or signal as its previous process at
// its start. A worker that exits with status 78 (launch.StatusPermanent:
// an error a restart cannot fix, such as an invalid configuration, a
// checkpoint directory of another model or of a finished job) is never
// restarted, whenever it comes, and etrun stops the whole job at once (the
// other workers get SIGTERM). A worker that exits with status 79
// (launch.StatusRefused: the running job refused it, its settings differ
// from those of the members that trained) is not restarted either, and
// the job goes on without it.
// A Go panic exits 2: it is restarted like a crash, except at a first
// start within -startup-window. Mind that etrun's flags go before the command: in
// "etrun ./my-worker -workers 3", -workers is the worker's flag.
//
// Scaling: -capacity FILE bounds the workers by a file holding a whole
// number (re-read every 250ms; an empty or unparsable read is ignored):
// when it drops, the newest workers get a SIGTERM and leave gracefully
// (they are not restarted, and do not fail or preempt the job); when it
// rises, workers start again, up to -workers (or what was added since).
// -autoscale lets the workers size the job themselves (their trainers'
// decisions start workers up to -max-workers and the capacity, and
// release the ones that do not pay). To add a worker to a running job by
// hand, send etrun a SIGUSR1 (kill -USR1 PID; etrun logs its PID at the
// start): each one starts one more worker, within -max-workers and the
// capacity.
//
// Exit status: 0 when the job finished (a worker exited 0), 143 when it
// was preempted (every worker left on the forwarded signal within the
// grace period, by itself, with status 143: a worker that the signal
// killed, having no handler, committed nothing and fails the job), 1 when
// it failed, 2 for a bad command line: etrun's, or the workers' when every
// worker that decided the failure exited 2 at its first start, and also 2
// when a worker stopped on a permanent error (status 78); 4 is a worker's
// status, not etrun's: a job whose workers found it already finished
// fails with 1.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/launch"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	cfg := launch.DefaultConfig()
	fs := flag.NewFlagSet("etrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes to start")
	fs.StringVar(&cfg.Redis, "redis", "", "host:port of the Redis the workers rendezvous through (default: an embedded Redis-protocol server)")
	fs.StringVar(&cfg.JobID, "job", "", "job ID (default: random)")
	fs.IntVar(&cfg.MaxRestarts, "max-restarts", cfg.MaxRestarts, "restarts of crashed workers over the whole job (0: none)")
	fs.DurationVar(&cfg.GracePeriod, "grace", cfg.GracePeriod, "how long the workers may take to leave after a forwarded SIGTERM or SIGINT, or to exit after the job finished, before they are SIGKILLed")
	fs.DurationVar(&cfg.StartupWindow, "startup-window", cfg.StartupWindow, "a worker failing this soon after its start is not restarted when a restart would repeat it (status 2 on its first start, or the same failure as its previous start); 0: restart every crash")
	fs.IntVar(&cfg.MaxWorkers, "max-workers", cfg.MaxWorkers, "most worker processes over the job: -workers plus every one added (SIGUSR1, -autoscale)")
	fs.BoolVar(&cfg.Autoscale, "autoscale", false, "let the workers size the job by measured goodput (ELASTICTRAIN_AUTOSCALE; their trainers start and release workers)")
	fs.StringVar(&cfg.CapacityFile, "capacity", "", "file holding how many workers are allowed now, re-read every 250ms: never more workers than it says; the newest leave gracefully when it drops, workers start again (up to -workers) when it rises")
	quiet := fs.Bool("quiet", false, "log only warnings and errors of the launcher")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: etrun [flags] [--] command [args...]\n\nRuns -workers processes of command as one elastic job.\n"+
			"Send etrun a SIGUSR1 (kill -USR1 PID) to add one worker to the running job. Flags:\n")
		fs.PrintDefaults()
	}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2
	}
	cmd := fs.Args()
	if len(cmd) == 0 {
		fmt.Fprintln(stderr, "etrun: no worker command: want etrun [flags] [--] command [args...]")
		return 2
	}
	if s := os.Getenv(launch.EnvSecret); s != "" {
		secret, err := hex.DecodeString(s)
		if err != nil || len(secret) < 16 {
			fmt.Fprintf(stderr, "etrun: %s must hold the job secret (hex, at least 16 bytes)\n", launch.EnvSecret)
			return 2
		}
		cfg.Secret = secret
	}
	if _, ok := stderr.(*os.File); !ok {
		// The workers' output is copied into it while etrun logs there
		// too: one lock for both (an *os.File is handed to the workers).
		stderr = &lockedWriter{w: stderr}
	}
	spec := launch.Spec{Command: cmd, Stdout: stdout, Stderr: stderr}
	if err := errors.Join(cfg.Validate(), spec.Validate()); err != nil {
		fmt.Fprintf(stderr, "etrun: %v\n", err)
		return 2
	}
	// go-redis logs each failed dial itself; launch's error for a store
	// that does not answer names the cause once.
	redis.SetLogger(quietRedis{})
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(prefixed{stderr}, &slog.HandlerOptions{Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return launch.ReplaceDurations(groups, a)
		}}))

	// Signals are caught before the first worker starts, so none is lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	adds := make(chan os.Signal, 8)
	signal.Notify(adds, syscall.SIGUSR1)
	defer signal.Stop(adds)
	job, err := launch.Start(context.Background(), spec, cfg, launch.WithLogger(log))
	if err != nil {
		fmt.Fprintf(stderr, "etrun: %v\n", err)
		return launch.StatusFailed
	}
	log.Info("send SIGUSR1 to add a worker", "pid", os.Getpid())
	done := make(chan struct{})
	forwarded := make(chan struct{})
	go func() { // owned by run: it ends when done closes
		defer close(forwarded)
		n := 0
		for {
			select {
			case <-adds:
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ws, err := job.Add(ctx, 1)
				cancel()
				if err != nil {
					log.Warn("SIGUSR1: cannot add a worker", "err", err)
				} else {
					log.Info("SIGUSR1: added a worker", "worker", ws)
				}
			case sig := <-sigs:
				if n++; n == 1 {
					job.Stop(sig)
				} else {
					job.Kill()
				}
			case <-done:
				return
			}
		}
	}()
	_, err = job.Wait()
	close(done)
	<-forwarded
	if err != nil {
		fmt.Fprintf(stderr, "etrun: %v\n", err)
	}
	if errors.Is(err, launch.ErrUsage) {
		fmt.Fprintln(stderr, usageHint(fs, cmd))
	}
	return launch.ExitStatus(err)
}

// usageHint says why the workers' command line may have been refused: one
// of etrun's own flags after the command (it went to the worker), or else
// to check the worker's flags.
func usageHint(fs *flag.FlagSet, cmd []string) string {
	var ours []string
	for _, a := range cmd[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name != "" && fs.Lookup(name) != nil {
			ours = append(ours, a)
		}
	}
	if len(ours) > 0 {
		return fmt.Sprintf("etrun: the worker's command line holds %s, etrun's own flag: etrun's flags go before the command "+
			"(etrun [flags] [--] command [args...]); after it they are the worker's", strings.Join(ours, " "))
	}
	return "etrun: the workers exited with status 2 at their first start, so they were not restarted: check the worker's command line"
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// quietRedis discards go-redis' own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// prefixed writes every log record (one Write each) after "etrun: ".
type prefixed struct{ w io.Writer }

func (p prefixed) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte("etrun: "), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}
