package trainer_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// A MicroStepFunc (WithMicroStep) takes deterministic mode's step in one
// call per rank: runs with it end with the same parameter bits as runs
// that call the StepFunc once per micro-batch, at 1 and 2 workers and
// through a kill and a join, and the StepFunc is not called.
func TestMicroStepKeepsDeterministicBits(t *testing.T) {
	run := func(workers int, fault, micro bool) (*trainertest.Model, int64, int64) {
		j := newMemJob(t, 480, 6, 2)
		j.micro, j.cfg.Deterministic = 4, true
		var calls, stepCalls atomic.Int64
		j.step = func(_ *trainertest.Worker, f StepFunc[trainertest.Batch]) StepFunc[trainertest.Batch] {
			return func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
				stepCalls.Add(1)
				return f(ctx, b)
			}
		}
		if micro {
			// Each micro-batch's own Step, written where the trainer
			// wants it: the same bits as the per-micro-batch calls.
			j.microStep = func(m *trainertest.Model) MicroStepFunc[trainertest.Batch] {
				return func(ctx context.Context, b dataloader.Batch[trainertest.Batch], grads [][][]float32, losses []float64) error {
					calls.Add(1)
					if len(grads) != len(b.Micro)-1 || len(losses) != len(b.Micro) {
						t.Errorf("%d gradient sets and %d losses for %d micro-batches", len(grads), len(losses), len(b.Micro))
					}
					for k := range b.Micro {
						l, err := m.Step(ctx, b.MicroBatch(k))
						if err != nil {
							return err
						}
						losses[k] = l
						if k < len(b.Micro)-1 {
							copy(grads[k][0], m.GW)
							copy(grads[k][1], m.GB)
						}
					}
					return nil
				}
			}
		}
		ws := make([]*trainertest.Worker, workers)
		for i := range ws {
			ws[i] = j.start()
		}
		var victim *trainertest.Worker
		if fault {
			j.waitStep(20)
			j.c.Kill(ws[1])
			victim = ws[1]
			j.waitStep(40)
			j.start()
		}
		j.c.Wait()
		for _, w := range ws {
			if w != victim {
				res, err := w.Result()
				require.NoError(t, err, "%v", w)
				require.True(t, res.Finished)
				return j.models[w], calls.Load(), stepCalls.Load()
			}
		}
		t.Fatal("no finisher")
		return nil, 0, 0
	}
	want, _, _ := run(2, false, false)
	for _, tc := range []struct {
		workers int
		fault   bool
	}{{1, false}, {2, false}, {3, true}} {
		got, calls, stepCalls := run(tc.workers, tc.fault, true)
		require.Positive(t, calls, "MicroStepFunc calls")
		// The MicroStepFunc above calls m.Step itself, not the
		// trainer's StepFunc.
		require.Zero(t, stepCalls, "StepFunc calls with a MicroStepFunc")
		require.Equal(t, want.W, got.W, "the weights' bits, %d workers (fault %v) with a MicroStepFunc", tc.workers, tc.fault)
		require.Equal(t, want.B, got.B)
	}
}

// New refuses a MicroStepFunc of another batch type.
func TestWithMicroStepOfAnotherBatchTypeIsRefused(t *testing.T) {
	m := trainertest.NewModel(2)
	p := trainertest.NewProblem(64, 2, 0, 1)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.MicroBatch = 8, 4
	l, err := dataloader.New(p.Dataset(), p.Collate, dcfg)
	require.NoError(t, err)
	defer l.Close()
	cfg := trainertest.Config("micro-type")
	cfg.Deterministic = true
	wrong := WithMicroStep(func(context.Context, dataloader.Batch[int], [][][]float32, []float64) error { return nil })
	_, err = New(m.Params(), NewSGD(0.1), l, m.Step, store.NewMemory(), cfg, wrong)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
