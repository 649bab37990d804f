package trainer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

// scalarAdam is Adam.Step as the trainer computed it before its fused
// kernel, element by element in float32: the bits the kernel must keep.
type scalarAdam struct {
	lr, b1, b2, eps float64
	t               int64
	m, v            [][]float32
}

func (o *scalarAdam) step(params []Param) {
	if o.m == nil {
		o.m, o.v = make([][]float32, len(params)), make([][]float32, len(params))
		for k, p := range params {
			o.m[k], o.v[k] = make([]float32, len(p.Value)), make([]float32, len(p.Value))
		}
	}
	o.t++
	alpha := float32(o.lr * math.Sqrt(1-math.Pow(o.b2, float64(o.t))) / (1 - math.Pow(o.b1, float64(o.t))))
	eps, fb1, fb2 := float32(o.eps), float32(o.b1), float32(o.b2)
	for k, p := range params {
		val, g, m, v := p.Value, p.Grad, o.m[k], o.v[k]
		for i := range val {
			gi := g[i]
			m[i] = fb1*m[i] + (1-fb1)*gi
			v[i] = fb2*v[i] + (1-fb2)*gi*gi
			val[i] -= alpha * m[i] / (float32(math.Sqrt(float64(v[i]))) + eps)
		}
	}
}

// appendAdamState is Adam's state encoding (optim.Adam.AppendState),
// written out here so that a change of it shows: learning rate, betas,
// epsilon, step count, then both moment estimates.
func appendAdamState(dst []byte, lr, b1, b2, eps float64, t int64, m, v [][]float32) []byte {
	for _, f := range []float64{lr, b1, b2, eps} {
		dst = enc.AppendF64(dst, f)
	}
	dst = enc.AppendF64(dst, math.Float64frombits(uint64(t)))
	dst = enc.AppendTensors(dst, m)
	return enc.AppendTensors(dst, v)
}

// randomParams returns parameters of lengths ns with random values and
// gradients.
func randomParams(r *rand.Rand, ns ...int) []Param {
	ps := make([]Param, len(ns))
	for i, n := range ns {
		ps[i] = Param{Name: string(rune('a' + i)), Shape: []int{n}, Value: make([]float32, n), Grad: make([]float32, n)}
		for j := range n {
			ps[i].Value[j] = float32(r.NormFloat64())
		}
	}
	return ps
}

func fillGrads(r *rand.Rand, ps []Param) {
	for _, p := range ps {
		for j := range p.Grad {
			p.Grad[j] = float32(r.NormFloat64() * 1e-2)
			if r.IntN(10) == 0 {
				p.Grad[j] = 0
			}
		}
	}
}

func requireSameBits(t *testing.T, want, got []Param) {
	t.Helper()
	for k := range want {
		for i := range want[k].Value {
			if math.Float32bits(want[k].Value[i]) != math.Float32bits(got[k].Value[i]) ||
				math.Float32bits(want[k].Grad[i]) != math.Float32bits(got[k].Grad[i]) {
				t.Fatalf("%s[%d]: value %v grad %v, want value %v grad %v", want[k].Name, i,
					got[k].Value[i], got[k].Grad[i], want[k].Value[i], want[k].Grad[i])
			}
		}
	}
}

// Adam's fused update (out of place after every commit, scaled or not)
// gives, step after step, the bits of the scalar update it replaced:
// results recorded before it (the deterministic runs' hashes) still hold.
func TestAdamKeepsTheScalarUpdatesBits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ref := randomParams(r, 203, 8, 1, 37)
	got := cloneParams(ref)
	scaled := cloneParams(ref)
	want := &scalarAdam{lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8}
	adam, adam2 := optim.NewAdam(1e-3), optim.NewAdam(1e-3)
	var sn [3]snapshot
	for step := range 40 {
		fillGrads(r, ref)
		inv := float32(1) / float32(1+step%7)
		for k := range ref {
			copy(got[k].Grad, ref[k].Grad)
			copy(scaled[k].Grad, ref[k].Grad)
			for i := range ref[k].Grad {
				ref[k].Grad[i] *= inv
				got[k].Grad[i] *= inv
			}
		}
		want.step(ref)
		require.NoError(t, adam.Step(got))
		require.NoError(t, adam2.StepScaled(scaled, inv))
		requireSameBits(t, ref, got)
		requireSameBits(t, ref, scaled)
		if step%3 != 2 { // commits at most steps, as CommitEvery > 1 would skip some
			sn[step%3].take(int64(step), 1, 0, got, adam, nil, nil, nil)
			sn[(step+1)%3].take(int64(step), 1, 0, scaled, adam2, nil, nil, nil)
		}
	}
	require.Equal(t, appendAdamState(nil, 1e-3, 0.9, 0.999, 1e-8, 40, want.m, want.v), adam.AppendState(nil))
	require.Equal(t, adam.AppendState(nil), adam2.AppendState(nil))
}

// A commit holds Adam's state without copying it, and it stays the state
// of its step whatever the optimizer does next: more steps, another
// commit, a commit retaken, a second commit with no step between, a load.
func TestAdamFrozenStateStaysItsSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ps := randomParams(r, 50, 3)
	adam := optim.NewAdam(1e-2)
	type held struct {
		sn   *snapshot
		want []byte
	}
	var commits []held
	check := func() {
		t.Helper()
		for i, c := range commits {
			require.Equal(t, c.want, c.sn.optState(), "commit %d", i)
			b := c.sn.encode(nil, ps)
			dec, err := decodeSnapshot(b, ps)
			require.NoError(t, err)
			require.Equal(t, c.want, dec.opt, "commit %d, encoded", i)
		}
	}
	// The trainer's rotation: latest, prev, and a spare retaken.
	var latest, prev, spare *snapshot
	commit := func() {
		sn := spare
		if sn == nil || sn == latest {
			sn = &snapshot{}
		}
		for i := range commits {
			if commits[i].sn == sn {
				commits = slices.Delete(commits, i, i+1)
				break
			}
		}
		sn.take(adam.Steps(), 1, 0, ps, adam, nil, nil, nil)
		commits = append(commits, held{sn, adam.AppendState(nil)})
		spare, prev, latest = prev, latest, sn
	}
	commit() // before any step: no moments yet
	check()
	for step := range 12 {
		fillGrads(r, ps)
		require.NoError(t, adam.Step(ps))
		check()
		commit()
		check()
		if step == 4 {
			commit() // no step since the last commit: a copy
			check()
		}
		if step == 7 {
			// A retaken commit that holds the current state.
			latest.take(adam.Steps(), 1, 0, ps, adam, nil, nil, nil)
			commits[len(commits)-1].want = adam.AppendState(nil)
			check()
		}
		if step == 9 {
			// Rollback to the previous commit: a load of its state.
			require.NoError(t, prev.restoreInto(ps, adam))
			require.Equal(t, prev.optState(), adam.AppendState(nil))
			check()
		}
	}
	// A clone owns its bytes.
	c := latest.clone()
	require.Nil(t, c.optFrozen)
	require.Equal(t, latest.optState(), c.opt)
	// An optimizer never recycles another one's frozen state.
	other := optim.NewAdam(1e-2)
	require.NoError(t, other.Step(cloneParams(ps)))
	want := latest.optState()
	s2 := *latest
	s2.take(1, 1, 0, ps, other, nil, nil, nil)
	require.NoError(t, other.Step(cloneParams(ps)))
	require.Equal(t, want, latest.optState())
}

// After the first commits, a step and its commit allocate nothing for the
// optimizer: the moments rotate through the commits' buffers.
func TestAdamCommitsRecycleTheirBuffers(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	ps := randomParams(r, 1000, 10)
	fillGrads(r, ps)
	adam := optim.NewAdam(1e-3)
	var latest, prev, spare *snapshot
	commit := func() {
		sn := spare
		if sn == nil || sn == latest {
			sn = &snapshot{}
		}
		sn.take(adam.Steps(), 1, 0, ps, adam, nil, nil, nil)
		spare, prev, latest = prev, latest, sn
	}
	for range 4 {
		require.NoError(t, adam.Step(ps))
		commit()
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := adam.StepScaled(ps, 0.5); err != nil {
			t.Fatal(err)
		}
		commit()
	})
	require.Zero(t, allocs)
}

// opaqueOptimizer hides an optimizer's optional interfaces: the trainer
// then scales the gradients in its own pass and encodes the state into
// every commit.
type opaqueOptimizer struct{ optim.Optimizer }

// BenchmarkOptimizerCommit: what a step of the MNIST MLP (203,530
// parameters) costs the trainer after the allreduce: the gradients scaled
// to their mean, Adam's update, the commit's snapshot. "frozen" is the
// trainer's path for Adam (scaled in Adam's pass, state held frozen by the
// commit); "encoded" scales in a separate pass and encodes Adam's state
// into the commit (the path of an optimizer without those interfaces, and
// Adam's before them).
func BenchmarkOptimizerCommit(b *testing.B) {
	for _, name := range []string{"frozen", "encoded"} {
		b.Run(name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(11, 12))
			ps := randomParams(r, 784*256, 256, 256*10, 10)
			fillGrads(r, ps)
			var opt optim.Optimizer = optim.NewAdam(1e-3)
			if name == "encoded" {
				opt = opaqueOptimizer{opt}
			}
			var latest, prev, spare *snapshot
			step := func() {
				if s, ok := opt.(optim.ScaledStepper); ok {
					if err := s.StepScaled(ps, 1); err != nil {
						b.Fatal(err)
					}
				} else {
					for _, p := range ps {
						for i := range p.Grad {
							p.Grad[i] *= 1
						}
					}
					if err := opt.Step(ps); err != nil {
						b.Fatal(err)
					}
				}
				sn := spare
				if sn == nil || sn == latest {
					sn = &snapshot{}
				}
				sn.take(1, 1, 0, ps, opt, nil, nil, nil)
				spare, prev, latest = prev, latest, sn
			}
			for range 4 { // until the buffers rotate
				step()
			}
			b.ReportAllocs()
			for b.Loop() {
				step()
			}
		})
	}
}
