package optim_test

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/trainer/optim"
)

// The Example runs a trainer: none of its goroutines outlives it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testParams() []optim.Param {
	return []optim.Param{
		{Name: "w", Shape: []int{2, 3}, Value: []float32{1, 2, 3, 4, 5, 6}, Grad: []float32{.1, .2, .3, .4, .5, .6}},
		{Name: "b", Shape: []int{3}, Value: []float32{-1, 0, 1}, Grad: []float32{.5, -.5, .25}},
	}
}

func cloneParams(ps []optim.Param) []optim.Param {
	out := make([]optim.Param, len(ps))
	for i, p := range ps {
		out[i] = optim.Param{Name: p.Name, Shape: slices.Clone(p.Shape), Value: slices.Clone(p.Value), Grad: slices.Clone(p.Grad)}
	}
	return out
}

func fuzzOptimizers() []optim.Optimizer {
	return []optim.Optimizer{optim.NewSGD(0.1), optim.NewMomentum(0.1, 0.9), optim.NewAdam(0.01)}
}

func TestAdamMatchesFloat64Reference(t *testing.T) {
	ps := testParams()
	opt := optim.NewAdam(0.01)
	// Reference in float64 with the textbook bias-corrected form.
	ref := make([]float64, 0)
	for _, p := range ps {
		for _, v := range p.Value {
			ref = append(ref, float64(v))
		}
	}
	m := make([]float64, len(ref))
	v := make([]float64, len(ref))
	for step := 1; step <= 5; step++ {
		require.NoError(t, opt.Step(ps))
		k := 0
		for _, p := range ps {
			for _, g := range p.Grad {
				gd := float64(g)
				m[k] = 0.9*m[k] + 0.1*gd
				v[k] = 0.999*v[k] + 0.001*gd*gd
				mh := m[k] / (1 - math.Pow(0.9, float64(step)))
				vh := v[k] / (1 - math.Pow(0.999, float64(step)))
				ref[k] -= 0.01 * mh / (math.Sqrt(vh) + 1e-8)
				k++
			}
		}
	}
	k := 0
	for _, p := range ps {
		for _, got := range p.Value {
			require.InDelta(t, ref[k], float64(got), 1e-5, "element %d", k)
			k++
		}
	}
	require.EqualValues(t, 5, opt.Steps())
}

// Restoring an optimizer's state must continue bit for bit.
func TestOptimizerStateRoundTripIsBitExact(t *testing.T) {
	for _, mk := range []func() optim.Optimizer{
		func() optim.Optimizer { return optim.NewSGD(0.1) },
		func() optim.Optimizer { return optim.NewMomentum(0.1, 0.9) },
		func() optim.Optimizer { return &optim.Momentum{LR: 0.05, Mu: 0.8, Nesterov: true} },
		func() optim.Optimizer { return optim.NewAdam(0.01) },
	} {
		opt := mk()
		t.Run(opt.Name(), func(t *testing.T) {
			ps := testParams()
			for range 3 {
				require.NoError(t, opt.Step(ps))
			}
			saved := opt.AppendState(nil)
			savedParams := cloneParams(ps)
			for range 2 {
				require.NoError(t, opt.Step(ps))
			}
			want := cloneParams(ps)

			other := mk()
			require.NoError(t, other.LoadState(saved, savedParams))
			require.Equal(t, saved, other.AppendState(nil), "save(restore(x)) == x")
			for range 2 {
				require.NoError(t, other.Step(savedParams))
			}
			for i := range want {
				require.Equal(t, want[i].Value, savedParams[i].Value)
			}
		})
	}
}

func TestOptimizerLoadStateRejectsGarbage(t *testing.T) {
	ps := testParams()
	adam := optim.NewAdam(0.01)
	require.NoError(t, adam.Step(ps))
	good := adam.AppendState(nil)
	for _, bad := range [][]byte{nil, good[:10], good[:len(good)-1], append(slices.Clone(good), 0)} {
		fresh := optim.NewAdam(0.5)
		err := fresh.LoadState(bad, ps)
		require.ErrorIs(t, err, optim.ErrCorruptState)
		require.Equal(t, 0.5, fresh.LR, "state unchanged on error")
	}
	// State for another model shape.
	other := []optim.Param{{Name: "w", Shape: []int{2}, Value: make([]float32, 2), Grad: make([]float32, 2)}}
	require.ErrorIs(t, optim.NewAdam(1).LoadState(good, other), optim.ErrCorruptState)
	require.ErrorIs(t, optim.NewMomentum(1, 0.9).LoadState(good, ps), optim.ErrCorruptState)
}

// FuzzOptimizerLoadState: optimizer state of any content loads (and then
// encodes back to the same bytes) or fails with optim.ErrCorruptState.
func FuzzOptimizerLoadState(f *testing.F) {
	ps := testParams()
	for i, opt := range fuzzOptimizers() {
		f.Add(uint8(i), opt.AppendState(nil))
		_ = opt.Step(cloneParams(ps))
		f.Add(uint8(i), opt.AppendState(nil))
	}
	f.Fuzz(func(t *testing.T, which uint8, state []byte) {
		opts := fuzzOptimizers()
		opt := opts[int(which)%len(opts)]
		if err := opt.LoadState(state, ps); err != nil {
			if !errors.Is(err, optim.ErrCorruptState) {
				t.Fatalf("%s: error %v does not wrap optim.ErrCorruptState", opt.Name(), err)
			}
			return
		}
		if got := opt.AppendState(nil); !bytes.Equal(got, state) {
			t.Fatalf("%s: loaded state encodes to %x, was %x", opt.Name(), got, state)
		}
	})
}
