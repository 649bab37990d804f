// Package trainertest helps test code built on package trainer without
// TCP or processes.
//
//   - A small deterministic model: linear regression on generated data
//     with a known optimum (NewProblem, NewModel). Its forward and
//     backward passes are plain loops in a fixed order, so a fixed batch
//     always gives the same bits.
//   - An in-memory driver.Backend (Network, Backend): rounds of
//     sync/synctest ranks, with the faults of that package
//     (NetworkConfig.OnGroup) and Backend.Kill.
//   - Cluster: N trainers of one job in one test over an in-memory
//     rendezvous store, each with its own Backend; Kill makes a worker
//     vanish as a SIGKILLed process does.
//
// # Use
//
//	c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
//	cfg := trainertest.Config("my-job")
//	for range 3 {
//		c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
//			m := trainertest.NewModel(prob.Dim)
//			loader, _ := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
//			return trainer.New(m.Params(), optim.NewSGD(0.3), loader, m.Step, w.Store, cfg, w.Options()...)
//		})
//	}
//	c.Wait()
package trainertest

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer"
)

// Sample is one example: features X and target Y.
type Sample struct {
	X []float32
	Y float32
}

// Batch is a collated batch: n samples of Dim features, row-major.
type Batch struct {
	X []float32
	Y []float32
}

// Problem is a generated regression problem y = w*·x + b* + noise.
type Problem struct {
	// Dim is the number of features.
	Dim int
	// Samples holds the data set.
	Samples []Sample
	// TrueW and TrueB are the generator's weights and bias.
	TrueW []float32
	TrueB float32
	// Noise is the standard deviation of the added noise.
	Noise float64
}

// splitmix64 is the generator of Steele, Lea & Flood, "Fast splittable
// pseudorandom number generators", OOPSLA 2014; used so the data never
// depends on the Go version.
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a float64 in [0, 1).
func (s *splitmix64) uniform() float64 { return float64(s.next()>>11) / (1 << 53) }

// normal returns a standard normal variate (Box-Muller).
func (s *splitmix64) normal() float64 {
	u1 := s.uniform()
	for u1 == 0 {
		u1 = s.uniform()
	}
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*s.uniform())
}

// NewProblem generates n samples of dim features from seed.
func NewProblem(n, dim int, noise float64, seed uint64) *Problem {
	rng := splitmix64(seed)
	p := &Problem{Dim: dim, TrueW: make([]float32, dim), Noise: noise}
	for i := range p.TrueW {
		p.TrueW[i] = float32(rng.normal())
	}
	p.TrueB = float32(rng.normal())
	p.Samples = make([]Sample, n)
	for i := range p.Samples {
		x := make([]float32, dim)
		y := float64(p.TrueB)
		for j := range x {
			x[j] = float32(rng.normal())
			y += float64(x[j]) * float64(p.TrueW[j])
		}
		p.Samples[i] = Sample{X: x, Y: float32(y + noise*rng.normal())}
	}
	return p
}

// Dataset returns the samples as a dataloader.Dataset.
func (p *Problem) Dataset() dataloader.Dataset[Sample] { return dataloader.FromSlice(p.Samples) }

// Collate packs samples into a Batch.
func (p *Problem) Collate(_ context.Context, samples []Sample, _ []int) (Batch, error) {
	b := Batch{X: make([]float32, 0, len(samples)*p.Dim), Y: make([]float32, 0, len(samples))}
	for _, s := range samples {
		if len(s.X) != p.Dim {
			return Batch{}, fmt.Errorf("trainertest: sample has %d features, want %d", len(s.X), p.Dim)
		}
		b.X = append(b.X, s.X...)
		b.Y = append(b.Y, s.Y)
	}
	return b, nil
}

// Model is the linear model y = w·x + b with squared loss 0.5*(y-ŷ)².
type Model struct {
	Dim  int
	W, B []float32 // values
	GW   []float32 // gradients
	GB   []float32
	// StepDelay simulates a heavier model: Step takes at least this long.
	StepDelay time.Duration
}

// NewModel returns a zero-initialised model of dim features.
func NewModel(dim int) *Model {
	return &Model{Dim: dim, W: make([]float32, dim), B: make([]float32, 1), GW: make([]float32, dim), GB: make([]float32, 1)}
}

// Params returns the trainer's view of the model, aliasing its buffers.
func (m *Model) Params() []trainer.Param {
	return []trainer.Param{
		{Name: "w", Shape: []int{m.Dim}, Value: m.W, Grad: m.GW},
		{Name: "b", Shape: []int{1}, Value: m.B, Grad: m.GB},
	}
}

// Step is a trainer.StepFunc: it fills the gradients with the sum over the
// batch of per-sample gradients and returns the summed loss.
func (m *Model) Step(ctx context.Context, b dataloader.Batch[Batch]) (float64, error) {
	if m.StepDelay > 0 {
		t := time.NewTimer(m.StepDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		}
	}
	clear(m.GW)
	m.GB[0] = 0
	var loss float64
	n := len(b.Data.Y)
	for i := range n {
		x := b.Data.X[i*m.Dim : (i+1)*m.Dim]
		pred := m.B[0]
		for j, xj := range x {
			pred += m.W[j] * xj
		}
		r := pred - b.Data.Y[i]
		loss += 0.5 * float64(r) * float64(r)
		for j, xj := range x {
			m.GW[j] += r * xj
		}
		m.GB[0] += r
	}
	return loss, nil
}

// Loss returns the mean squared-error loss 0.5*(y-ŷ)² of the model over the problem's samples.
func (m *Model) Loss(p *Problem) float64 {
	var s float64
	for _, smp := range p.Samples {
		pred := float64(m.B[0])
		for j, xj := range smp.X {
			pred += float64(m.W[j]) * float64(xj)
		}
		r := pred - float64(smp.Y)
		s += 0.5 * r * r
	}
	return s / float64(len(p.Samples))
}

// OptimumLoss is the loss of the generator's own weights, which the least
// squares optimum can only beat by a little (about Noise²/2 in all).
func (p *Problem) OptimumLoss() float64 {
	m := NewModel(p.Dim)
	copy(m.W, p.TrueW)
	m.B[0] = p.TrueB
	return m.Loss(p)
}
