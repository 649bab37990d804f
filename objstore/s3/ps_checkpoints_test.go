package s3

import (
	"context"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/internal/s3server"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/ps"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// TestPSCheckpointsInObjectStorage: a parameter-server job with no shared
// directory (ps.Config.Dir empty) checkpoints to a real S3-compatible
// server: each rank's shards, encoded from the commits in its memory, go
// into rank 0's checkpoint, which its checkpoint goroutine writes to the
// server while training goes on. The whole job is killed; two workers
// restart it from the server (every row of the table from the checkpoint)
// and finish with every sample of every epoch trained exactly once.
func TestPSCheckpointsInObjectStorage(t *testing.T) {
	srv := s3server.Start(t)
	const prefix = "jobs/ps/"
	prob := trainertest.NewProblem(960, 16, 0.05, 5)
	const batch, seed, epochs, rows = 16, 7, 3, 97
	perEpoch := int64(len(prob.Samples) / batch)
	audit := &trainer.MemoryAudit{}
	secret := []byte("ps checkpoints in object storage")

	var (
		mu     stdsync.Mutex
		rounds []trainer.RoundInfo
		parts  []*ps.Partition
	)
	goodCh := make(chan int64, 1024)
	build := func(jobID string, workers int) func(w *trainertest.Worker) (trainertest.Runner, error) {
		return func(w *trainertest.Worker) (trainertest.Runner, error) {
			m := trainertest.NewModel(prob.Dim)
			m.StepDelay = time.Millisecond
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed = batch, seed
			loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			pcfg := ps.DefaultConfig()
			pcfg.Tables = []paramserver.TableSpec{{Name: "offsets", Rows: rows, Dim: 1, Optimizer: paramserver.NewSparseAdagrad(0.05)}}
			pcfg.Sync.JobID, pcfg.Sync.Secret, pcfg.KeepTables = jobID, secret, true
			part, err := ps.New(pcfg)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			parts = append(parts, part)
			mu.Unlock()
			step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
				ids := make([]int64, len(b.Indices))
				for i, ix := range b.Indices {
					ids[i] = int64(ix % rows)
				}
				pulled := paramserver.Rows{Table: 0, IDs: ids, Values: make([]float32, len(ids))}
				if err := part.Pull(ctx, pulled); err != nil {
					return 0, err
				}
				loss, err := m.Step(ctx, b)
				if err != nil {
					return 0, err
				}
				grads := paramserver.Rows{Table: 0, IDs: ids, Values: make([]float32, len(ids))}
				for i, v := range pulled.Values { // pulls every offset towards 0.1
					grads.Values[i] = (v - 0.1) / float32(b.GlobalSize)
				}
				return loss, part.Push(ctx, grads)
			}
			st := newTestStore(t, testConfig(srv, prefix))
			cfg := trainertest.Config(jobID)
			cfg.Epochs, cfg.CheckpointEvery, cfg.Sync.Secret = epochs, 5, secret
			cfg.Elastic.MinWorkers = workers
			opts := append(w.Options(), trainer.WithAudit(audit), trainer.WithCheckpointStore(st), trainer.WithPartition(part),
				trainer.WithHooks(trainer.Hooks{
					OnRound: func(r trainer.RoundInfo) {
						mu.Lock()
						rounds = append(rounds, r)
						mu.Unlock()
					},
					OnCheckpoint: func(step int64, err error) {
						if err == nil {
							select {
							case goodCh <- step:
							default:
							}
						}
					},
				}))
			return trainer.New(m.Params(), trainer.NewMomentum(0.02, 0.9), loader, step, w.Store, cfg, opts...)
		}
	}

	c1 := trainertest.NewCluster(t, trainertest.ClusterConfig{Timeout: 5 * time.Minute})
	var ws []*trainertest.Worker
	for range 3 {
		ws = append(ws, c1.Start(build(t.Name()+"-a", 3)))
	}
	deadline := time.After(2 * time.Minute)
	for s := int64(0); s < 20; {
		select {
		case s = <-goodCh:
		case <-deadline:
			t.Fatal("no checkpoint of step >= 20 was written")
		}
	}
	for _, w := range ws {
		c1.Kill(w)
	}
	for _, w := range ws {
		<-w.Done()
	}
	st := newTestStore(t, testConfig(srv, prefix))
	steps, err := st.List(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, steps)
	prev := steps[0]

	mu.Lock()
	rounds, parts = nil, nil
	mu.Unlock()
	c2 := trainertest.NewCluster(t, trainertest.ClusterConfig{Timeout: 5 * time.Minute})
	ws2 := []*trainertest.Worker{c2.Start(build(t.Name()+"-b", 2)), c2.Start(build(t.Name()+"-b", 2))}
	c2.Wait()
	for _, w := range ws2 {
		res, err := w.Result()
		require.NoError(t, err, "%v", w)
		require.True(t, res.Finished, "%v", w)
		require.Equal(t, epochs*perEpoch, res.Step, "%v", w)
	}
	mu.Lock()
	defer mu.Unlock()
	first := slices.MinFunc(rounds, func(a, b trainer.RoundInfo) int { return int(a.Round) - int(b.Round) })
	require.Equal(t, "checkpoint", first.Source)
	require.Equal(t, prev, first.Step)
	var stored int64
	for _, p := range parts {
		_, s := p.Restored()
		stored += s
	}
	require.Positive(t, stored, "rows restored from the checkpoint in object storage")

	n := len(prob.Samples)
	rep := trainer.VerifyAudit(audit.Entries(), epochs, func(epoch int) []int {
		return dataloader.Order(seed, epoch, n)[:n/batch*batch]
	})
	require.Zero(t, rep.Missing, "%+v", rep)
	require.Zero(t, rep.Duplicates, "%+v", rep)
	require.Equal(t, int(epochs*perEpoch), rep.Steps, "%+v", rep)
}
