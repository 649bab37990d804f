// A worker written against the README of the 2026-12-04 release (before
// the packages were split by role, issue #31), put together from its
// snippets: "Writing a step function", "Learning-rate schedules",
// "Parameter-server tables", "Leased data shards", "Launching workers",
// "Redis Sentinel" and "TLS". It is kept as that README's reader wrote it:
// release_test.go builds it against this checkout, and it must compile
// unchanged (names that moved since are deprecated aliases and wrappers).
// It is never run.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/ps"
)

type MySample struct {
	X  [4]float32
	ID int64
}

type MyBatch struct {
	X   [][4]float32
	IDs []int64
}

func makeBatch(s []MySample) MyBatch {
	var b MyBatch
	for _, v := range s {
		b.X = append(b.X, v.X)
		b.IDs = append(b.IDs, v.ID)
	}
	return b
}

func main() {
	logger := slog.Default()
	redis.SetLogger(elastic.RedisLogger(logger))
	ctx := context.Background()

	w, err := launch.WorkerEnv() // Store, JobID, Secret, Index, Workers, Restart, GracePeriod
	if err != nil {
		log.Fatal(err) // launch.ErrNotLaunched outside a launcher
	}
	cfg := trainer.DefaultConfig()
	w.Configure(&cfg) // JobID, Sync.Secret, and GracePeriod within the launcher's
	cfg.Epochs = 3
	cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = 2, 8
	cfg.ListenAddr = "0.0.0.0:29500"
	cfg.Sync.AdvertiseAddr = os.Getenv("POD_IP")

	if os.Getenv("TLS") != "" {
		caPEM, _ := os.ReadFile("/tls/ca.crt")
		cert, _ := tls.LoadX509KeyPair("/tls/tls.crt", "/tls/tls.key")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM) // /tls/ca.crt
		cfg.Sync.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
		cfg.Sync.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool,
			ServerName: "peers.myjob.internal", MinVersion: tls.VersionTLS13}
	}

	var rdb redis.UniversalClient = redis.NewClient(&redis.Options{Addr: w.Store})
	if os.Getenv("SENTINEL") != "" {
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:    "mymaster",
			SentinelAddrs: []string{"sentinel-0:26379", "sentinel-1:26379", "sentinel-2:26379"},
		})
	}
	store := elastic.NewRedisStore(rdb)

	// 1. The model's parameters.
	w1, gw1 := make([]float32, 4*16), make([]float32, 4*16)
	b1, gb1 := make([]float32, 16), make([]float32, 16)
	params := []trainer.Param{
		{Name: "w1", Shape: []int{4, 16}, Value: w1, Grad: gw1},
		{Name: "b1", Shape: []int{16}, Value: b1, Grad: gb1},
	}

	// 2. The data: a fixed split of each global batch, or leased shards.
	samples := make([]MySample, 4096)
	for i := range samples {
		samples[i].ID = int64(i % 1024)
	}
	dataset := dataloader.FromSlice(samples) // samples []MySample
	collate := func(ctx context.Context, s []MySample, indices []int) (MyBatch, error) {
		return makeBatch(s), nil // copy what you keep: s and indices are reused
	}
	var loader trainer.Source[MyBatch]
	if os.Getenv("LEASED") == "" {
		l, err := dataloader.New(dataset, collate, dataloader.Config{
			GlobalBatch: 64, Seed: 1, Shuffle: true, DropLast: true, Prefetch: 2, Workers: 1,
		})
		if err != nil {
			log.Fatal(err)
		}
		loader = l
	} else {
		qcfg := redisqueue.DefaultConfig() // shards of 1024 samples, leases of 30 s
		qcfg.JobID, qcfg.Shards.DatasetLen = "my-job", dataset.Len()
		q, err := redisqueue.New(rdb, qcfg)
		if err != nil {
			log.Fatal(err)
		}
		lcfg := dataloader.DefaultLeasedConfig()
		lcfg.Shards = q.Config().Shards
		lcfg.GlobalBatch, lcfg.Seed, lcfg.Epochs = 64, 1, cfg.Epochs
		lcfg.LeaseAhead = cfg.CommitEvery // lease the steps up to the next commit at each commit
		lcfg.Balance = true               // slower ranks take fewer samples of each global batch
		l, err := dataloader.NewLeased(q, dataset, collate, lcfg)
		if err != nil {
			log.Fatal(err)
		}
		loader = l
	}

	// 3. Checkpoints and the parameter-server tables.
	ckpts, err := trainer.NewLocalDir("/data/ckpt", 3) // keeps the newest 3
	if err != nil {
		log.Fatal(err)
	}
	pcfg := ps.DefaultConfig()
	pcfg.Tables = []sync.TableSpec{{Name: "items", Rows: 1 << 20, Dim: 16, Optimizer: sync.NewSparseAdagrad(0.1)}}
	pcfg.PS.Mode = sync.PSSync
	pcfg.Dir = "/shared/job/shards" // every worker's: commits and checkpoint shards
	pcfg.Sync.JobID, pcfg.Sync.Secret = cfg.JobID, cfg.Sync.Secret
	pcfg.Checkpoints = ckpts // the trainer's CheckpointStore: keep what it lists
	part, err := ps.New(pcfg)
	if err != nil {
		log.Fatal(err)
	}

	// 4. The step: pull this share's rows, overwrite every Grad, push.
	step := func(ctx context.Context, b dataloader.Batch[MyBatch]) (float64, error) {
		ids := b.Data.IDs
		rows := make([]float32, len(ids)*16)
		if err := part.Pull(ctx, sync.Rows{Table: 0, IDs: ids, Values: rows}); err != nil {
			return 0, err
		}
		clear(gw1)
		clear(gb1)
		grads := make([]float32, len(rows))
		return 0, part.Push(ctx, sync.Rows{Table: 0, IDs: ids, Values: grads})
	}

	// 5. Schedule, hooks, the trainer, and the exit status.
	sched := trainer.WarmupCosine{Base: 0.1, Warmup: 500, Total: 20000, Min: 1e-4} // or trainer.StepDecay, trainer.ScheduleFunc
	var _ trainer.Schedule = trainer.StepDecay{Base: 0.1, Every: 1000, Gamma: 0.5}
	var _ trainer.Schedule = trainer.ScheduleFunc(func(step int64) float64 { return 0.1 })
	t, err := trainer.New(params, trainer.NewMomentum(0.1, 0.9), loader, step, store, cfg,
		trainer.WithSchedule(sched),
		trainer.WithPartition(part),
		trainer.WithCheckpointStore(ckpts),
		trainer.WithLogger(logger),
		trainer.WithHooks(trainer.Hooks{OnStep: func(s trainer.StepInfo) {
			if s.Step%100 == 0 {
				logger.Info("step", "step", s.Step, "lr", s.LearningRate)
			}
		}}),
	)
	if err != nil {
		log.Fatal(err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sigs
		t.Preempt()
	}()
	res, err := t.Run(ctx)
	switch {
	case err == nil:
		logger.Info("finished", "steps", res.Step, "loss", res.Loss)
	case errors.Is(err, trainer.ErrPreempted), errors.Is(err, trainer.ErrFailureBudget),
		errors.Is(err, trainer.ErrModelMismatch), errors.Is(err, elastic.ErrStoreUnavailable),
		errors.Is(err, elastic.ErrJobFinished):
		log.Print(err) // why it stopped: the launcher sees only the exit status
	default:
		log.Print(err)
	}
	os.Exit(launch.ExitStatus(err)) // 0 finished, 143 preempted, 4 job already finished, 1 failed
}
