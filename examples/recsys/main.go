// Command recsys trains a click-through model whose user and item
// embeddings live on elastictrain's parameter server (package sync), with
// the small dense part allreduced in the same step (a hybrid step, as in
// DLRM), on a generated click log with a known best achievable AUC (see
// GenConfig). Several local worker processes rendezvous through Redis (an
// embedded Redis-protocol server unless -redis is given); each hosts one
// shard of the tables. Faults can be injected: when a worker hosting a
// shard is killed, the survivors form a new round, roll back to the last
// commit and re-partition the rows over themselves, taking the dead
// worker's rows from the shard store; a joining worker gets its rows from
// their live owners.
//
// Data comes from dynamic shards by default: each epoch is cut into shards
// leased from a queue in Redis, and every global batch is split over the
// ranks by their measured speed, so a slow worker (-slow) takes less of it;
// -dynamic=false uses the loader's fixed split by rank instead. Either way
// every sample of every epoch is applied exactly once, which the launcher
// checks from an audit log written by the workers.
//
//	go run ./examples/recsys -json
//	go run ./examples/recsys -workers 4 -kill 1@600 -join 1@1000 -json
//	go run ./examples/recsys -slow 1:20us -json
//
// The final line with -json holds auc, oracle_auc (the generator's own
// model scored on the same test impressions), rows, recoveries and
// wall_seconds, recovery_seconds (per kill, until a later round trains
// samples), empty_steps and empty_step_seconds (steps that trained
// nothing, e.g. waiting for data shards, and the time they took), and the
// audit's counts (samples_applied, audit_missing, audit_duplicates), among
// others. Run with -h for every flag.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/examples/internal/launcher"
)

// config holds the parsed flags.
type config struct {
	workers, min, max int
	epochs, batch     int
	dim, commitEvery  int
	lr, denseLR       float64
	gen               GenConfig
	redis, shardDir   string
	json, quiet       bool
	faults            []launcher.Fault
	detect            time.Duration
	dynamic           bool
	shardSize         int
	lease             time.Duration
	slowWorker        int
	slowPerSample     time.Duration
	audit             string
	job               string // set by the launcher for workers
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{gen: DefaultGenConfig()}
	fs := flag.NewFlagSet("recsys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.workers, "workers", 3, "number of worker processes to start (each hosts one parameter-server shard)")
	fs.IntVar(&c.min, "min", 1, "minimum world size to train (rendezvous MinWorkers)")
	fs.IntVar(&c.max, "max", 64, "maximum world size (rendezvous MaxWorkers)")
	fs.IntVar(&c.epochs, "epochs", 3, "epochs to train")
	fs.IntVar(&c.batch, "batch", 1024, "global batch size (impressions per step, split over the workers)")
	fs.IntVar(&c.dim, "dim", 16, "embedding dimension")
	fs.IntVar(&c.commitEvery, "commit-every", 20, "steps between commits (parameter-server shards to the shard store, dense state in memory)")
	fs.Float64Var(&c.lr, "lr", 0.2, "sparse Adagrad learning rate of the embeddings")
	fs.Float64Var(&c.denseLR, "dense-lr", 0.01, "Adam learning rate of the dense weights")
	fs.IntVar(&c.gen.Users, "users", c.gen.Users, "rows of the user table (users in the generated log)")
	fs.IntVar(&c.gen.Items, "items", c.gen.Items, "rows of the item table (items in the generated log)")
	fs.IntVar(&c.gen.Impressions, "impressions", c.gen.Impressions, "impressions in the generated log (train + test)")
	fs.IntVar(&c.gen.Latent, "latent", c.gen.Latent, "dimension of the generator's hidden user and item vectors")
	fs.Float64Var(&c.gen.Zipf, "zipf", c.gen.Zipf, "Zipf exponent of item popularity")
	fs.Uint64Var(&c.gen.Seed, "seed", c.gen.Seed, "seed of the generated log, the data order and the initial weights")
	fs.StringVar(&c.redis, "redis", "", "Redis address host:port (default: an embedded Redis-protocol server)")
	fs.StringVar(&c.shardDir, "shard-dir", "", "directory of the parameter-server shard store (default: a temporary directory)")
	fs.BoolVar(&c.json, "json", false, "print one JSON object with the results as the last line")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines")
	fs.DurationVar(&c.detect, "detect", 2*time.Second, "failure detection time: member lease TTL")
	fs.Var(launcher.Faults{Kind: launcher.Kill, List: &c.faults}, "kill", "SIGKILL the worker holding RANK when the job reaches STEP: RANK@STEP (repeatable)")
	fs.Var(launcher.Faults{Kind: launcher.Join, List: &c.faults}, "join", "start N more workers when the job reaches STEP: N@STEP (repeatable)")
	fs.BoolVar(&c.dynamic, "dynamic", true, "dynamic data shards: lease shards of each epoch from a queue in Redis and split each global batch over the ranks by their measured speed; false: the loader's fixed split by rank")
	fs.IntVar(&c.shardSize, "shard-size", 2048, "-dynamic: samples per data shard")
	fs.DurationVar(&c.lease, "lease", 20*time.Second, "-dynamic: data shard lease TTL (must exceed the recovery time; a dead worker's leases are revoked when the next round forms, not left to expire)")
	slow := fs.String("slow", "", "make one worker slow: INDEX:DURATION adds DURATION of compute per sample on the worker of launch index INDEX")
	fs.StringVar(&c.audit, "audit", "", "append the exactly-once audit log to this file (default: a temporary file)")
	fs.StringVar(&c.job, "job", "", "job ID (default: random; workers get it from the launcher)")
	if err := jobenv.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	c.slowWorker = -1
	if *slow != "" {
		i, d, ok := strings.Cut(*slow, ":")
		n, err1 := strconv.Atoi(i)
		dur, err2 := time.ParseDuration(d)
		if !ok || err1 != nil || err2 != nil || n < 0 || dur <= 0 {
			return nil, fmt.Errorf("-slow %q: want INDEX:DURATION, e.g. 1:20us", *slow)
		}
		c.slowWorker, c.slowPerSample = n, dur
	}
	if c.dynamic && (c.shardSize < 1 || c.lease < 4*c.detect) {
		return nil, fmt.Errorf("-shard-size %d must be positive and -lease %v at least 4 times -detect %v", c.shardSize, c.lease, c.detect)
	}
	switch {
	case c.workers < 1:
		return nil, fmt.Errorf("-workers %d: want at least 1", c.workers)
	case c.min < 1 || c.max < c.min || c.workers > c.max || c.min > c.workers:
		return nil, fmt.Errorf("-min %d, -max %d, -workers %d: want 1 <= min <= workers <= max", c.min, c.max, c.workers)
	case c.epochs < 1 || c.batch < 1 || c.dim < 1 || c.commitEvery < 1:
		return nil, fmt.Errorf("-epochs, -batch, -dim and -commit-every must be positive")
	case !(c.lr > 0) || !(c.denseLR > 0) || math.IsInf(c.lr, 1) || math.IsInf(c.denseLR, 1):
		return nil, fmt.Errorf("-lr %v and -dense-lr %v must be positive and finite", c.lr, c.denseLR)
	case c.detect < 100*time.Millisecond:
		return nil, fmt.Errorf("-detect %v: want at least 100ms", c.detect)
	}
	if err := c.gen.Validate(); err != nil {
		return nil, err
	}
	if err := launcher.CheckFaults(c.faults, c.workers, c.max); err != nil {
		return nil, err
	}
	if err := jobenv.CheckJobID(c.job); err != nil {
		return nil, err
	}
	return c, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	return jobenv.Run("recsys", stderr, err, func() int { return runWorker(cfg, stderr) },
		func(ctx context.Context) error { return runLauncher(ctx, cfg, stdout, stderr) })
}

// workerArgs are the flags passed on to every worker.
func workerArgs(c *config) []string {
	g := c.gen
	a := []string{
		"-epochs", fmt.Sprint(c.epochs), "-batch", fmt.Sprint(c.batch), "-dim", fmt.Sprint(c.dim),
		"-commit-every", fmt.Sprint(c.commitEvery), "-lr", fmt.Sprint(c.lr), "-dense-lr", fmt.Sprint(c.denseLR),
		"-users", fmt.Sprint(g.Users), "-items", fmt.Sprint(g.Items), "-impressions", fmt.Sprint(g.Impressions),
		"-latent", fmt.Sprint(g.Latent), "-zipf", fmt.Sprint(g.Zipf), "-seed", fmt.Sprint(g.Seed),
		"-min", fmt.Sprint(c.min), "-max", fmt.Sprint(c.max), "-redis", c.redis, "-shard-dir", c.shardDir,
		"-job", c.job, "-detect", c.detect.String(), "-audit", c.audit,
		"-shard-size", fmt.Sprint(c.shardSize), "-lease", c.lease.String(), "-dynamic=" + fmt.Sprint(c.dynamic),
	}
	if c.slowWorker >= 0 {
		a = append(a, "-slow", fmt.Sprintf("%d:%v", c.slowWorker, c.slowPerSample))
	}
	return a
}

// result is the final JSON line.
type result struct {
	AUC             float64   `json:"auc"`
	OracleAUC       float64   `json:"oracle_auc"`
	Gap             float64   `json:"gap"`
	Rows            int64     `json:"rows"`
	Users           int       `json:"users"`
	Items           int       `json:"items"`
	Dim             int       `json:"dim"`
	TrainImpr       int       `json:"train_impressions"`
	TestImpr        int       `json:"test_impressions"`
	Epochs          int       `json:"epochs"`
	Steps           int64     `json:"steps"`
	Workers         int       `json:"workers"`
	WorldSizes      []int     `json:"world_sizes"`
	Rounds          int       `json:"rounds"`
	Recoveries      int       `json:"recoveries"`
	RecoverySeconds []float64 `json:"recovery_seconds"`
	EmptySteps      int       `json:"empty_steps"`
	EmptySeconds    float64   `json:"empty_step_seconds"`
	PulledRows      int64     `json:"pulled_rows"`
	SamplesApplied  int       `json:"samples_applied"`
	AuditMissing    int       `json:"audit_missing"`
	AuditDuplicates int       `json:"audit_duplicates"`
	Dynamic         bool      `json:"dynamic"`
	MeanShare       []float64 `json:"mean_share_by_rank"`
	WallSeconds     float64   `json:"wall_seconds"`
	Redis           string    `json:"redis"`
	// Loss is the mean loss per impression of the last step; null when it
	// is not a finite number, and then Diverged is true.
	Loss     *float64 `json:"loss"`
	Diverged bool     `json:"diverged"`
}

func runLauncher(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	start := time.Now()
	// launcher.Run serialises its writes to stderr with the workers' output
	// it copies there; this function writes only before and after it.
	if c.job == "" {
		c.job = jobenv.NewJobID("recsys")
	}
	store, err := jobenv.OpenStore(ctx, c.redis)
	if err != nil {
		return err
	}
	defer store.Close()
	c.redis = store.Addr
	if c.audit == "" {
		path, remove, err := jobenv.TempFile("elastictrain-recsys-audit-", "audit.log")
		if err != nil {
			return err
		}
		defer remove()
		c.audit = path
	}
	if c.shardDir == "" {
		dir, err := os.MkdirTemp("", "elastictrain-recsys-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		c.shardDir = dir
	}
	fmt.Fprintf(stderr, "[launcher] job %s: %d workers, %d users x %d items, dim %d, %d impressions, %d epochs, global batch %d, store %s, %d cores\n",
		c.job, c.workers, c.gen.Users, c.gen.Items, c.dim, c.gen.Impressions, c.epochs, c.batch, store.Desc, runtime.NumCPU())
	sum, err := launcher.Run(ctx, launcher.Spec{
		Workers: c.workers, MaxWorkers: c.max, Args: workerArgs(c), Faults: c.faults, Log: stderr, Quiet: c.quiet,
		Store: store.Addr, JobID: c.job,
	})
	if err != nil {
		return jobenv.LaunchError(c.job, err)
	}
	if sum.Done == nil {
		return fmt.Errorf("the job ended without a final report (exits: %v)", sum.Exits)
	}
	res := result{Workers: c.workers, Redis: store.Desc, Rounds: len(sum.Rounds), WorldSizes: sum.WorldSizes(),
		RecoverySeconds: append([]float64{}, sum.Recoveries...), Recoveries: sum.RecoveryRounds(), Epochs: c.epochs, Dim: c.dim, Users: c.gen.Users, Items: c.gen.Items,
		Rows: int64(c.gen.Users + c.gen.Items), Steps: sum.Done.Step}
	// Steps that trained nothing: with -dynamic, one or two at each epoch's
	// end while the last shards are acked, and every step while the ranks
	// wait for a shard to come back.
	for i, st := range sum.Steps {
		if st.Samples == 0 {
			res.EmptySteps++
			if i > 0 {
				res.EmptySeconds += st.At - sum.Steps[i-1].At
			}
		}
	}
	x := sum.Done.Extra
	num := func(k string) float64 { v, _ := x[k].(float64); return v }
	res.AUC, res.OracleAUC = num("auc"), num("oracle_auc")
	res.Gap = res.OracleAUC - res.AUC
	res.TrainImpr, res.TestImpr = int(num("train")), int(num("test"))
	res.PulledRows = int64(num("pulled_rows"))
	if l := sum.Done.Loss; !math.IsNaN(l) && !math.IsInf(l, 0) {
		res.Loss = &l
	} else {
		res.Diverged = true
	}
	rep, err := verifyAudit(c.audit, c, res.TrainImpr)
	if err != nil {
		return err
	}
	res.SamplesApplied, res.AuditMissing, res.AuditDuplicates, res.MeanShare = rep.Samples, rep.Missing, rep.Duplicates, rep.MeanShare
	res.Dynamic = c.dynamic
	res.WallSeconds = time.Since(start).Seconds()
	fmt.Fprintf(stdout, "test AUC %.4f (oracle %.4f, gap %.4f) after %d steps in %.1f s; world sizes %v; %d rounds, %d recoveries; audit: %d samples, %d missing, %d duplicates\n",
		res.AUC, res.OracleAUC, res.Gap, res.Steps, res.WallSeconds, res.WorldSizes, res.Rounds, res.Recoveries, res.SamplesApplied, res.AuditMissing, res.AuditDuplicates)
	if res.Diverged {
		fmt.Fprintf(stdout, "training diverged: the last loss is %v (try a smaller -lr than %v or -dense-lr than %v)\n", sum.Done.Loss, c.lr, c.denseLR)
	}
	if c.json {
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("result: %w", err)
		}
		fmt.Fprintln(stdout, string(b))
	}
	if res.Diverged {
		return fmt.Errorf("training diverged (last loss %v)", sum.Done.Loss)
	}
	return nil
}
