// Command recsys trains a click-through model whose embeddings live on the
// parameter server (trainer/ps: rows partitioned over the workers, commits
// replicated in their memory) and whose dense part is allreduced (a hybrid
// step, as in DLRM), on a click log with a known best AUC, through kills,
// joins, -term and restarts from -checkpoint, with an audit of exactly-once.
//
//	go run ./examples/recsys -workers 3 -kill 1@300 -join 1@600 -json
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/examples/internal/telemetry"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/faults"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/ps"
)

// config holds the parsed flags; args is the command line, which the
// workers get too.
type config struct {
	workers, min, max, epochs, batch, dim, commitEvery, slowWorker int
	lr, denseLR                                                    float64
	gen                                                            GenConfig
	redis, dir, ckpt, audit, job, otlp, metrics, listen            string
	json, quiet, dynamic                                           bool
	faults                                                         []faults.Fault
	detect, slow                                                   time.Duration
	args                                                           []string
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{gen: DefaultGenConfig(), args: args}
	fs := flag.NewFlagSet("recsys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.workers, "workers", 3, "worker processes to start (each hosts a shard of the tables)")
	fs.IntVar(&c.min, "min", 1, "minimum world size to train")
	fs.IntVar(&c.max, "max", 64, "maximum world size")
	fs.IntVar(&c.epochs, "epochs", 3, "epochs to train")
	fs.IntVar(&c.batch, "batch", 1024, "global batch size (impressions per step)")
	fs.IntVar(&c.dim, "dim", 16, "embedding dimension")
	fs.IntVar(&c.commitEvery, "commit-every", 20, "steps between commits (checkpoints: every 5 commits)")
	fs.Float64Var(&c.lr, "lr", 0.2, "sparse Adagrad learning rate of the embeddings")
	fs.Float64Var(&c.denseLR, "dense-lr", 0.01, "Adam learning rate of the dense weights")
	fs.IntVar(&c.gen.Users, "users", c.gen.Users, "users (rows of the user table)")
	fs.IntVar(&c.gen.Items, "items", c.gen.Items, "items (rows of the item table)")
	fs.IntVar(&c.gen.Impressions, "impressions", c.gen.Impressions, "impressions in the log (train + test)")
	fs.Uint64Var(&c.gen.Seed, "seed", c.gen.Seed, "seed of the log, the data order and the initial weights")
	fs.StringVar(&c.redis, "redis", "", "Redis address host:port (default: an embedded Redis-protocol server)")
	fs.StringVar(&c.ckpt, "checkpoint", "", "directory of durable checkpoints (the tables' shards in them, written in the background) and the audit log; a job started again on it resumes")
	fs.StringVar(&c.dir, "shard-dir", "", "deprecated: a directory (shared by every worker) the commits also write the shards to; default none: commits stay in the workers' memory, replicated")
	fs.StringVar(&c.audit, "audit", "", "the exactly-once audit log (default: DIR/audit.log of -checkpoint, or a temporary one)")
	fs.StringVar(&c.job, "job", "", "job ID (default: random)")
	fs.StringVar(&c.otlp, "otlp", "", telemetry.OTLPHelp)
	fs.StringVar(&c.metrics, "metrics", "", telemetry.MetricsHelp)
	fs.BoolVar(&c.json, "json", false, "print the results as one JSON object on the last line")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines")
	fs.BoolVar(&c.dynamic, "dynamic", false, "lease data shards from a queue in Redis (default: the loader's fixed split)")
	fs.DurationVar(&c.detect, "detect", 2*time.Second, "failure detection time: member lease TTL")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "host:port the trainer and the parameter server listen on (0.0.0.0:0 across hosts: each advertises its host's address)")
	for _, k := range []faults.Kind{faults.Kill, faults.Stop, faults.Term, faults.Join, faults.KillHost} {
		fs.Var(faults.Flag{Kind: k, List: &c.faults}, string(k), "SIG"+strings.ToUpper(strings.TrimSuffix(string(k), "host"))+" the worker holding RANK (killhost: every worker on its host) at STEP: RANK@STEP, repeatable (join: start N more, N@STEP)")
	}
	fs.IntVar(&c.slowWorker, "slow-worker", -1, "launch index of a worker made slow by -slow (a straggler)")
	fs.DurationVar(&c.slow, "slow", 0, "compute time added per sample on -slow-worker")
	if err := jobenv.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	switch {
	case c.workers < 1 || c.min < 1 || c.max < c.min || c.workers > c.max || c.min > c.workers:
		return nil, fmt.Errorf("-min %d, -max %d, -workers %d: want 1 <= min <= workers <= max", c.min, c.max, c.workers)
	case c.epochs < 1 || c.batch < 1 || c.dim < 1 || c.commitEvery < 1:
		return nil, fmt.Errorf("-epochs, -batch, -dim and -commit-every must be positive")
	case !(c.lr > 0) || !(c.denseLR > 0) || math.IsInf(c.lr, 1) || math.IsInf(c.denseLR, 1):
		return nil, fmt.Errorf("-lr %v and -dense-lr %v must be positive and finite", c.lr, c.denseLR)
	case c.detect < 100*time.Millisecond || c.detect > 5*time.Second:
		return nil, fmt.Errorf("-detect %v: want 100ms to 5s (data shard leases last 30 s)", c.detect)
	case c.gen.Users < 1 || c.gen.Items < 1 || c.gen.Impressions < 10:
		return nil, fmt.Errorf("-users %d and -items %d must be positive, -impressions %d at least 10", c.gen.Users, c.gen.Items, c.gen.Impressions)
	}
	if err := cmp.Or(faults.Check(c.faults, c.workers, c.max), telemetry.ValidateFlags(c.otlp, c.metrics)); err != nil {
		return nil, err
	}
	return c, jobenv.CheckJobID(c.job)
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	return jobenv.Run("recsys", stderr, err, func() int { return runWorker(cfg, stderr) },
		func(ctx context.Context) error { return runLauncher(ctx, cfg, stdout, stderr) })
}

func runLauncher(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	start := time.Now()
	c.job = cmp.Or(c.job, jobenv.NewJobID("recsys"))
	store, err := jobenv.OpenStore(ctx, c.redis)
	if err != nil {
		return err
	}
	defer store.Close()
	tmp, err := os.MkdirTemp("", "elastictrain-recsys-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	base := cmp.Or(c.ckpt, tmp)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return fmt.Errorf("-checkpoint: %w", err)
	}
	c.audit = cmp.Or(c.audit, filepath.Join(base, "audit.log"))
	fmt.Fprintf(stderr, "[launcher] job %s: %d workers, %d users x %d items, dim %d, %d impressions, %d epochs, global batch %d, store %s\n",
		c.job, c.workers, c.gen.Users, c.gen.Items, c.dim, c.gen.Impressions, c.epochs, c.batch, store.Desc)
	args := append(slices.Clone(c.args), "-job", c.job, "-redis", store.Addr, "-shard-dir", c.dir, "-audit", c.audit) // later flags win
	sum, err := monitor.Run(ctx, monitor.Spec{Workers: c.workers, MaxWorkers: c.max, Args: args, Faults: c.faults,
		Log: stderr, Quiet: c.quiet, Store: store.Addr, JobID: c.job})
	if err != nil {
		return jobenv.LaunchError(c.job, err)
	}
	if sum.Done == nil {
		return fmt.Errorf("the job ended without a final report (exits: %v)", sum.Exits)
	}
	num := func(k string) float64 { v, _ := sum.Done.Extra[k].(float64); return v }
	n := int(num("train"))
	m := n // samples applied per epoch: leased shards cover the whole epoch, the loader drops the last partial batch
	if !c.dynamic {
		m = n / c.batch * c.batch
	}
	rep, err := jobenv.VerifyAuditFile(c.audit, c.epochs, func(epoch int) []int { return dataloader.Order(c.gen.Seed, epoch, n)[:m] })
	if err != nil {
		return err
	}
	first := append(sum.Rounds, monitor.RoundSeen{})[0]
	res := map[string]any{"auc": num("auc"), "oracle_auc": num("oracle_auc"), "loss": sum.Done.Loss, "steps": sum.Done.Step,
		"start_step": first.Step, "start_source": first.Source, "world_sizes": sum.WorldSizes(), "commit_seconds": num("commit_seconds"), "checkpoints": num("checkpoints"), "checkpoint_blocked_seconds": num("ckpt_blocked"), "checkpoint_writes": num("ckpt_writes"), "checkpoint_write_seconds": num("ckpt_write"),
		"recoveries": sum.RecoveriesFromFailures(), "recovery_seconds": append([]float64{}, sum.Recoveries...), "exits": sum.Exits,
		"samples_applied": rep.Samples, "audit_missing": rep.Missing, "audit_duplicates": rep.Duplicates,
		"restored_rows": map[string]float64{"peers": num("restored_peers"), "storage": num("restored_storage")}, "dynamic": c.dynamic, "wall_seconds": time.Since(start).Seconds()}
	fmt.Fprintf(stdout, "test AUC %.4f (oracle %.4f) after %d steps in %.1f s; world sizes %v; %d recoveries; audit: %d samples, %d missing, %d duplicates\n",
		res["auc"], res["oracle_auc"], res["steps"], res["wall_seconds"], res["world_sizes"], res["recoveries"], rep.Samples, rep.Missing, rep.Duplicates)
	b, err := json.Marshal(res)
	if c.json && err == nil {
		fmt.Fprintln(stdout, string(b))
	}
	return err
}

// runWorker trains as one worker of the job and returns its exit status:
// 0, 1 on error, 143 (128+SIGTERM) when it left after a preemption.
func runWorker(c *config, stderr io.Writer) int {
	ev := launch.NewEmitter()
	fail := jobenv.Fail(ev, stderr, "recsys")
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: launch.ReplaceDurations}))
	tcfg := trainer.DefaultConfig()
	tcfg.JobID, tcfg.Epochs, tcfg.CommitEvery, tcfg.ListenAddr = c.job, c.epochs, c.commitEvery, c.listen
	w, err := launch.WorkerEnv()
	if err != nil {
		return fail(err)
	}
	w.Configure(&tcfg) // the launcher's job ID and secret, and a grace period that ends before its own
	e := &tcfg.Elastic
	e.MinWorkers, e.MaxWorkers, e.LeaseTTL, e.HeartbeatInterval, e.LastCall = c.min, c.max, c.detect, c.detect/6, time.Second
	pcfg := ps.DefaultConfig()
	pcfg.Dir, pcfg.Sync, pcfg.Logger, pcfg.KeepTables, pcfg.ListenAddr = c.dir, tcfg.Sync, log, true, c.listen
	pcfg.Tables = []paramserver.TableSpec{{Name: "users", Rows: int64(c.gen.Users), Dim: c.dim, Optimizer: paramserver.NewSparseAdagrad(c.lr), InitScale: 0.1, Seed: c.gen.Seed},
		{Name: "items", Rows: int64(c.gen.Items), Dim: c.dim, Optimizer: paramserver.NewSparseAdagrad(c.lr), InitScale: 0.1, Seed: c.gen.Seed + 1}}
	pcfg.Sync.JobID = tcfg.JobID
	audit, err := audit.OpenFile(c.audit)
	if err != nil {
		return fail(err)
	}
	defer audit.Close()
	hooks := jobenv.TrainerHooks(ev)
	hooks.OnStraggler = func(s trainer.StragglerInfo) {
		fmt.Fprintf(stderr, "recsys worker %d: rank %d straggles at step %d: %.1f times the median compute time\n", os.Getpid(), s.Rank, s.Step, s.Ratio)
	}
	tel, err := telemetry.New(context.Background(), "elastictrain-recsys", c.otlp, c.metrics, telemetry.WorkerIndex(), tcfg.JobID)
	if err != nil {
		return fail(err)
	}
	defer tel.Close()
	opts := append(tel.Options(), trainer.WithAudit(audit), trainer.WithLogger(log), trainer.WithHooks(hooks))
	if c.ckpt != "" {
		st, err := checkpoint.NewLocalDir(filepath.Join(c.ckpt, "trainer"), 3)
		if err != nil {
			return fail(err)
		}
		opts, pcfg.Checkpoints, tcfg.CheckpointEvery = append(opts, trainer.WithCheckpointStore(st)), st, 5*c.commitEvery
	}
	part, err := ps.New(pcfg)
	if err != nil {
		return fail(err)
	}
	train, test := Generate(c.gen)
	model, look := NewModel(c.dim), &Lookup{}
	if strconv.Itoa(c.slowWorker) != os.Getenv(launch.EnvWorker) {
		c.slow = 0 // -slow applies to -slow-worker only
	}
	step := func(ctx context.Context, b dataloader.Batch[[]Sample]) (float64, error) {
		look.Prepare(b.Data, c.dim)
		if err := part.Pull(ctx, paramserver.Rows{Table: tableUsers, IDs: look.Users, Values: look.UVals},
			paramserver.Rows{Table: tableItems, IDs: look.Items, Values: look.IVals}); err != nil {
			return 0, err
		}
		loss := model.Backward(b.Data, look)
		time.Sleep(c.slow * time.Duration(len(b.Data))) // an injected slow machine
		if slices.ContainsFunc(append(look.UGrad, look.IGrad...), func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }) {
			return 0, fmt.Errorf("training diverged: the embedding gradients are not finite (loss %v); try a smaller -lr or -dense-lr", loss)
		}
		return loss, part.Push(ctx, paramserver.Rows{Table: tableUsers, IDs: look.Users, Values: look.UGrad},
			paramserver.Rows{Table: tableItems, IDs: look.Items, Values: look.IGrad})
	}
	client := redis.NewClient(&redis.Options{Addr: c.redis, DialTimeout: 2 * time.Second})
	defer client.Close()
	loader, err := newLoader(c, client, train)
	if err != nil {
		return fail(err)
	}
	if l, ok := loader.(io.Closer); ok {
		defer l.Close()
	}
	tr, err := trainer.New([]trainer.Param{{Name: "dense", Shape: []int{c.dim + 1}, Value: model.Dense, Grad: model.Grad}}, optim.NewAdam(c.denseLR), loader, step, jobenv.NewPendingStore(client, ev), tcfg, append(opts, trainer.WithPartition(part))...)
	if err != nil {
		return fail(err)
	}
	stop := jobenv.PreemptOnSIGTERM(tr.Preempt)
	res, err := tr.Run(context.Background())
	stop()
	switch {
	case errors.Is(err, trainer.ErrCheckpoint):
		return fail(err) // a preemption or job end whose checkpoint failed was not clean (launch.ExitStatus's rule)
	case errors.Is(err, trainer.ErrPreempted):
		return 143
	case errors.Is(err, elastic.ErrJobFinished) && res.Step > 0: // finished by the others while this worker was out
		return 0
	case errors.Is(err, elastic.ErrJobFinished): // an earlier run of this job ID finished it
		ev.Emit(launch.Event{Ev: launch.EvFinished})
		return 0
	case err != nil:
		return fail(err)
	case res.Rank != 0:
		return 0
	}
	tabs, err := part.Tables(context.Background()) // the final commit's rows, gathered at the end of the last round
	if err != nil {
		return fail(err)
	}
	peers, stored := part.Restored() // over the rounds this rank saw: all of them for a rank 0 that was never killed
	auc := AUC(test, func(s Sample) float64 {
		return model.Logit(tabs[tableUsers][int(s.User)*c.dim:], tabs[tableItems][int(s.Item)*c.dim:])
	})
	ev.Emit(launch.Event{Ev: launch.EvDone, Rank: 0, Step: res.Step, Epoch: res.Epochs, Loss: res.Loss,
		Extra: map[string]any{"auc": auc, "oracle_auc": AUC(test, func(s Sample) float64 { return float64(s.P) }), "train": len(train),
			"restored_peers": peers, "restored_storage": stored, "commit_seconds": part.CommitSeconds(), "checkpoints": res.Checkpoints,
			"ckpt_blocked": res.CheckpointBlockedSeconds, "ckpt_writes": res.CheckpointWrites, "ckpt_write": res.CheckpointWriteSeconds}})
	return 0
}

// newLoader returns the leased-shard loader of -dynamic (its queue in
// Redis), else the loader of the fixed split.
func newLoader(c *config, client *redis.Client, train []Sample) (trainer.Source[[]Sample], error) {
	ds, collate := dataloader.FromSlice(train), func(_ context.Context, s []Sample, _ []int) ([]Sample, error) { return slices.Clone(s), nil }
	if !c.dynamic {
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.Seed = c.batch, c.gen.Seed
		return dataloader.New(ds, collate, dcfg)
	}
	qcfg := redisqueue.DefaultConfig()
	qcfg.JobID, qcfg.Shards.DatasetLen = c.job, len(train)
	q, err := redisqueue.New(client, qcfg)
	if err != nil {
		return nil, err
	}
	lcfg := dataloader.DefaultLeasedConfig()
	lcfg.Shards, lcfg.GlobalBatch, lcfg.Seed, lcfg.Epochs, lcfg.LeaseAhead, lcfg.Balance = q.Config().Shards, c.batch, c.gen.Seed, c.epochs, c.commitEvery, true
	return dataloader.NewLeased(q, ds, collate, lcfg)
}
