package optim_test

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/optim"
)

// Every optimizer gives the bits it gave before it moved out of package
// trainer (the hashes were taken with trainer.NewSGD and the others at the
// commit before the move): 25 steps on random gradients, a learning rate
// halved at step 10, a state saved and loaded at step 12; the hash covers
// the parameters after every step and the final encoded state, so both
// the update and the checkpoint encoding are pinned.
func TestOptimizersKeepTheirBits(t *testing.T) {
	for _, c := range []struct {
		mk   func() optim.Optimizer
		want string
	}{
		{func() optim.Optimizer { o := optim.NewSGD(0.1); o.WeightDecay = 1e-3; return o },
			"9f5484e399de26aba68be3fe2abb7205793eadd02eefd9a9010b608b063c155b"},
		{func() optim.Optimizer { return optim.NewMomentum(0.1, 0.9) },
			"f6e09515326d11bc6cf602a72df771ab70793788daff8bebae08c018c47a72de"},
		{func() optim.Optimizer { return &optim.Momentum{LR: 0.05, Mu: 0.8, Nesterov: true} },
			"1dd4dea2657a96880e6046bca59fbf588a7b431651ad84069b2f61d3dfad8075"},
		{func() optim.Optimizer { return optim.NewAdam(1e-3) },
			"c8532ca7381f07a62c38e1c327125adf87bce741f5a3e14eee6982369d2429e6"},
	} {
		opt := c.mk()
		t.Run(opt.Name(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(31, 32))
			var ps []optim.Param
			for i, n := range []int{203, 8, 1, 37} {
				p := optim.Param{Name: fmt.Sprint("p", i), Shape: []int{n}, Value: make([]float32, n), Grad: make([]float32, n)}
				for j := range n {
					p.Value[j] = float32(r.NormFloat64())
				}
				ps = append(ps, p)
			}
			r = rand.New(rand.NewPCG(33, 34))
			h := sha256.New()
			for step := range 25 {
				for _, p := range ps {
					for j := range p.Grad {
						p.Grad[j] = float32(r.NormFloat64() * 1e-2)
					}
				}
				if step == 10 {
					opt.SetLearningRate(opt.LearningRate() / 2)
				}
				require.NoError(t, opt.Step(ps))
				if step == 12 {
					require.NoError(t, opt.LoadState(opt.AppendState(nil), ps))
				}
				for _, p := range ps {
					for _, v := range p.Value {
						h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
					}
				}
			}
			h.Write(opt.AppendState(nil))
			require.Equal(t, c.want, fmt.Sprintf("%x", h.Sum(nil)))
		})
	}
}
